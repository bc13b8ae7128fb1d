//! What one client may ask of the server: body bytes, prompt and completion
//! tokens per request, and connections open at once. The request bounds are
//! checked in `api` and `mod`; the connection bound lives here, in a listener
//! that answers a connection past it with 503 instead of serving it.

use axum::serve::Listener;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server's bounds (`vkllm serve --max-*` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for (400 above it), and what
    /// a request that gives none gets, so leaving it out is no way around.
    pub max_completion_tokens: usize,
    /// Longest prompt in tokens (400 above it); `None`: the context alone.
    pub max_prompt_tokens: Option<usize>,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
}

impl Limits {
    /// The defaults: 4 MiB holds any 128k-token prompt as JSON text or ids;
    /// 32,768 tokens is Qwen3's advised output length, so clients sending
    /// that are served; 64 connections cover a browser's six and a client
    /// pool's share.
    pub const DEFAULT: Limits = Limits {
        max_body_bytes: 4 << 20,
        max_completion_tokens: 32_768,
        max_prompt_tokens: None,
        max_connections: 64,
    };
}

/// How long a refused connection may take to send its request and read
/// the 503 before it is closed.
const REFUSAL_GRACE: Duration = Duration::from_secs(2);

/// A TCP listener that holds at most `max` connections open: each accepted
/// socket carries a permit, returned when hyper drops it. Past the bound
/// the socket is not queued (a queued client would wait with no word, and
/// a stuck one would block the rest) but answered 503 with `Retry-After`.
pub struct BoundedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
}

impl BoundedListener {
    pub fn new(inner: TcpListener, max: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl Listener for BoundedListener {
    type Io = CountedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = Listener::accept(&mut self.inner).await;
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    return (
                        CountedStream {
                            stream,
                            _permit: permit,
                        },
                        addr,
                    )
                }
                Err(_) => {
                    tokio::spawn(refuse(stream, self.max));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Answers a connection past the bound with 503 and closes it. The request
/// is read (up to the grace period) after the answer: closing a socket with
/// unread bytes would reset it, and the client would see that, not the 503.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = super::api::ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        ..super::api::ApiError::invalid(
            format!("the server has {max} connections open, its limit; retry shortly"),
            None,
        )
    }
    .body()
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let drain = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    };
    // A client that went away or stalls only ends this early.
    let _ = tokio::time::timeout(REFUSAL_GRACE, drain).await;
}

/// An accepted socket holding one of the listener's permits.
pub struct CountedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
