//! A small HTTP/1.1 client on std's `TcpStream`, for what curl cannot do
//! from a test: hundreds of clients from threads, and a client that leaves
//! in the middle of a stream (its socket dropped).

use serde_json::Value;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// A response whose head is read; the body is read as it comes.
pub struct Response {
    pub status: u16,
    body: BufReader<Body>,
}

/// A response body, chunked or up to the close.
struct Body {
    inner: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes left in the current chunk.
    left: usize,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.chunked {
            return self.inner.read(buf);
        }
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        self.left -= n;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// Sends one request (`Connection: close`) and reads the response's head.
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> Response {
    send(addr, method, path, body, "close")
}

/// `GET path` on a connection kept alive: the server holds it open (and
/// counts it) while the response lives.
pub fn get_kept_alive(addr: &str, path: &str) -> Response {
    send(addr, "GET", path, "", "keep-alive")
}

/// One request with the `Connection` header `connection`, the response's
/// head read.
fn send(addr: &str, method: &str, path: &str, body: &str, connection: &str) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect to the server");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut inner = BufReader::new(s);
    let mut line = String::new();
    inner.read_line(&mut line).expect("read the status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"));
    let mut chunked = false;
    loop {
        line.clear();
        inner.read_line(&mut line).expect("read a header");
        if line.trim().is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
    }
    let body = Body {
        inner,
        chunked,
        left: 0,
        done: false,
    };
    Response {
        status,
        body: BufReader::new(body),
    }
}

pub fn post(addr: &str, path: &str, body: &str) -> Response {
    request(addr, "POST", path, body)
}

/// `GET /health`'s JSON.
pub fn health(addr: &str) -> Value {
    let r = request(addr, "GET", "/health", "");
    assert_eq!(r.status, 200);
    r.json()
}

impl Response {
    /// The whole body as JSON.
    pub fn json(mut self) -> Value {
        let mut text = String::new();
        self.body.read_to_string(&mut text).expect("read the body");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// The next server-sent event's data (`[DONE]` included), or `None`
    /// once the stream has ended.
    pub fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.body.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }
}
