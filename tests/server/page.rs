//! The chat page at `/`, in a real headless Chromium driven through
//! chromedriver's WebDriver protocol (plain HTTP, `crate::http`): type a
//! question, see the streamed answer arrive piece by piece, stop a long one,
//! find the conversation again after a reload, reset it; with an API key,
//! the page stays reachable and asks for the key. Chromium and chromedriver
//! come from scripts/install-deps.sh; under CI=true their absence fails the
//! test, elsewhere it is skipped with the reason printed.

use crate::{curl, http, start, start_with};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ANSWER: &str = "The capital of France is Paris.";
const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";
/// Each wait's bound: generous, the machine may be shared.
const PATIENCE: Duration = Duration::from_secs(90);

#[test]
fn the_page_is_open_and_self_contained_while_the_api_needs_a_key() {
    let s = start_with(&["--api-key", "page-key"], &[]);
    let root = s.base.trim_end_matches("/v1");
    let (page, status) = curl(&["-sS", "-i", "-o", "-", &format!("{root}/")]);
    assert!(status.starts_with("200 text/html"), "{status}");
    let (head, body) = page.split_once("\r\n\r\n").expect("a head and a body");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("connect-src 'self'"), "{head}");
    // Nothing fetched from elsewhere: no absolute URL at all.
    assert!(body.contains("/v1/chat/completions"), "{body}");
    assert!(!body.contains("://"), "the page names an external address");
    let (_, status) = curl(&[&format!("{}/models", s.base)]);
    assert!(status.starts_with("401"), "{status}");
}

#[test]
fn the_page_streams_a_reply_stops_keeps_and_resets_the_chat() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let mut s = start();
    let root = s.base.trim_end_matches("/v1").to_string();
    let d = browser.start();
    d.goto(&format!("{root}/"));
    d.wait_for(&format!(
        "document.getElementById('model').textContent === '{MODEL}'"
    ));
    d.click("#toggle-settings");
    d.type_into("#temperature", "0");
    d.type_into("#max_tokens", "64");
    // Every text the reply shows, as rendered: each render puts new nodes
    // into the reply's element, and the records keep them.
    d.script(
        "window.seen = [];
         new MutationObserver((records) => {
           for (const r of records) {
             if (!r.target.matches || !r.target.matches('.msg.assistant .text')) continue;
             const text = [...r.addedNodes].map((n) => n.textContent).join('');
             window.seen.push([text, document.body.dataset.state]);
           }
         }).observe(document.getElementById('messages'), {subtree: true, childList: true});",
    );
    d.type_into("#prompt", "What is the capital of France?");
    d.click("#send");
    d.wait_idle();
    assert_eq!(d.texts(".msg.assistant .text"), [ANSWER]);
    let seen = d.script("return window.seen;");
    let streamed: Vec<&str> = seen
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p[1] == "streaming")
        .map(|p| p[0].as_str().unwrap())
        .collect();
    // The reply grew while it streamed: several nonempty texts, each the
    // one before with more after it.
    assert!(
        streamed.iter().filter(|t| !t.is_empty()).count() >= 3,
        "{seen}"
    );
    for pair in streamed.windows(2) {
        assert!(
            pair[1].starts_with(pair[0]) && pair[1].len() >= pair[0].len(),
            "{seen}"
        );
    }
    assert_eq!(streamed.last(), Some(&ANSWER), "{seen}");
    assert_eq!(d.text("#status"), "");

    // Stop: a long reply is cut where it was, marked, and the server is
    // told (its slot frees).
    d.clear("#max_tokens");
    d.type_into("#max_tokens", "600");
    d.type_into(
        "#prompt",
        "Write a very long story about a dragon and a knight.",
    );
    d.click("#send");
    d.wait_for(
        "document.body.dataset.state === 'streaming' && \
         document.querySelectorAll('.msg.assistant .text')[1].textContent.length > 20",
    );
    d.click("#stop");
    d.wait_idle();
    assert_eq!(d.texts(".msg.assistant .note"), ["(stopped)"]);
    let partial = d.texts(".msg.assistant .text")[1].clone();
    assert!(partial.len() > 20, "{partial}");
    let addr = root.trim_start_matches("http://");
    let freed = (0..100).any(|_| {
        http::health(addr)["slots"]["busy"] == 0 || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(freed, "the stopped request still holds a slot");

    // Kept in the browser: a reload shows the conversation and settings.
    d.goto(&format!("{root}/"));
    d.wait_for(&format!(
        "document.getElementById('model').textContent === '{MODEL}'"
    ));
    assert_eq!(d.texts(".msg .text").len(), 4);
    assert_eq!(
        d.texts(".msg.user .text")[0],
        "What is the capital of France?"
    );
    assert_eq!(
        d.texts(".msg.assistant .text"),
        [ANSWER.to_string(), partial.clone()]
    );
    assert_eq!(
        d.script("return document.getElementById('temperature').value;"),
        "0"
    );

    // New chat: the conversation is gone, after a reload too; the settings
    // stay.
    d.click("#reset");
    assert!(d.texts(".msg").is_empty());
    assert_eq!(d.texts("#empty").len(), 1);
    d.goto(&format!("{root}/"));
    d.wait_for(&format!(
        "document.getElementById('model').textContent === '{MODEL}'"
    ));
    assert!(d.texts(".msg").is_empty());
    assert_eq!(
        d.script("return document.getElementById('max_tokens').value;"),
        "600"
    );

    // A reply is text, never markup; ``` fences become code blocks.
    let reply = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b>\n\
                 ```python\nprint('<hi>')\n```\nafter";
    let chat = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]);
    let js = format!(
        "localStorage.setItem('vkllm.chat', {});",
        json!(chat.to_string())
    );
    d.script(&js);
    d.goto(&format!("{root}/"));
    d.wait_for(&format!(
        "document.getElementById('model').textContent === '{MODEL}'"
    ));
    assert_eq!(
        d.script("return document.querySelectorAll('#messages img, #messages b').length;"),
        0
    );
    assert_eq!(d.texts(".msg.assistant pre code"), ["print('<hi>')"]);
    assert_eq!(
        d.texts(".msg.assistant .text"),
        ["<img src=x onerror=\"document.title='pwned'\"><b>bold</b>\nprint('<hi>')after"]
    );
    assert_ne!(d.script("return document.title;"), "pwned");
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
}

#[test]
fn the_page_asks_for_the_api_key_and_sends_it() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let s = start_with(&["--api-key", "page-key"], &[]);
    let root = s.base.trim_end_matches("/v1").to_string();
    let d = browser.start();
    d.goto(&format!("{root}/"));
    d.wait_for("document.getElementById('model').textContent === '(API key needed)'");
    assert!(
        d.text("#status").contains("API key"),
        "{}",
        d.text("#status")
    );
    assert_eq!(
        d.script("return document.getElementById('settings').hidden;"),
        false
    );
    // A question without the key is refused and handed back to retry.
    d.type_into("#prompt", "What is the capital of France?");
    d.click("#send");
    d.wait_idle();
    assert!(d.texts(".msg").is_empty());
    assert_eq!(
        d.script("return document.getElementById('prompt').value;"),
        "What is the capital of France?"
    );
    d.type_into("#api-key", "page-key");
    d.type_into("#temperature", "0");
    // Leaving the field commits the key: the model's name comes.
    d.click("#prompt");
    d.wait_for(&format!(
        "document.getElementById('model').textContent === '{MODEL}'"
    ));
    assert_eq!(
        d.script("return localStorage.getItem('vkllm.apiKey');"),
        "\"page-key\""
    );
    d.click("#send");
    d.wait_idle();
    assert_eq!(d.texts(".msg.assistant .text"), [ANSWER]);
}

/// Chromium and chromedriver, found on this machine.
struct Browser {
    chromium: PathBuf,
    driver: PathBuf,
}

impl Browser {
    /// Both programs (`VKLLM_CHROMIUM` and `VKLLM_CHROMEDRIVER` override the
    /// search), or `None` with the reason printed where a skip is allowed.
    fn find() -> Option<Browser> {
        let look = |var: &str, names: &[&str]| -> Option<PathBuf> {
            if let Some(p) = std::env::var_os(var) {
                return Some(PathBuf::from(p));
            }
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
                .find(|p| p.is_file())
        };
        let chromium = look(
            "VKLLM_CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
        );
        let driver = look("VKLLM_CHROMEDRIVER", &["chromedriver"]);
        match (chromium, driver) {
            (Some(chromium), Some(driver)) => Some(Browser { chromium, driver }),
            _ => {
                // CI installs both (scripts/install-deps.sh); there it must run.
                assert!(
                    std::env::var_os("CI").is_none(),
                    "chromium or chromedriver is missing; run scripts/install-deps.sh"
                );
                eprintln!(
                    "SKIPPING the chat page's browser test: no chromium and chromedriver \
                     (run scripts/install-deps.sh)"
                );
                None
            }
        }
    }

    /// chromedriver on a free port, and one headless session in a fresh
    /// profile.
    fn start(&self) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&self.driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut d = Driver {
            child,
            addr: format!("127.0.0.1:{port}"),
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&d.addr).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The flags that keep Chromium off the (closed) network.
        let args = json!([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            format!("--user-data-dir={}", d._profile.path().display()),
        ]);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": self.chromium, "args": args},
        }}});
        let v = d.call("POST", "/session", &caps);
        d.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        d
    }
}

/// A WebDriver session; the session and chromedriver end when dropped.
struct Driver {
    child: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = webdriver_request(&self.addr, "DELETE", &path, "");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// One WebDriver command; its `value`, or a panic with the error.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = match method {
            "GET" | "DELETE" => String::new(),
            _ => body.to_string(),
        };
        let (status, text) = webdriver_request(&self.addr, method, path, &body);
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
        assert!(status == 200, "WebDriver {method} {path}: {status} {v}");
        v["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn goto(&self, url: &str) {
        self.session_call("POST", "/url", &json!({"url": url}));
    }

    fn script(&self, js: &str) -> Value {
        self.session_call("POST", "/execute/sync", &json!({"script": js, "args": []}))
    }

    /// The element `css` selects (the first).
    fn element(&self, css: &str) -> String {
        let v = self.session_call(
            "POST",
            "/element",
            &json!({"using": "css selector", "value": css}),
        );
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.session_call("POST", &format!("/element/{e}/click"), &json!({}));
    }

    /// Keys typed into `css`, after what it holds.
    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.session_call(
            "POST",
            &format!("/element/{e}/value"),
            &json!({"text": text}),
        );
    }

    fn clear(&self, css: &str) {
        let e = self.element(css);
        self.session_call("POST", &format!("/element/{e}/clear"), &json!({}));
    }

    fn text(&self, css: &str) -> String {
        let js = format!("return document.querySelector({}).textContent;", json!(css));
        self.script(&js).as_str().unwrap_or_default().to_string()
    }

    /// The text of every element `css` selects.
    fn texts(&self, css: &str) -> Vec<String> {
        let js = format!(
            "return [...document.querySelectorAll({})].map((e) => e.textContent);",
            json!(css)
        );
        let v = self.script(&js);
        v.as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|t| t.as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Polls until the JavaScript expression `cond` is true.
    fn wait_for(&self, cond: &str) {
        let js = format!("try {{ return !!({cond}); }} catch (e) {{ return false; }}");
        let deadline = Instant::now() + PATIENCE;
        while self.script(&js) != true {
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {cond}; the page shows: {}",
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Until no reply is streaming.
    fn wait_idle(&self) {
        self.wait_for("document.body.dataset.state === 'idle'");
    }
}

/// One HTTP request to chromedriver: its status and body. chromedriver
/// answers `Connection: close` but keeps the socket open, so the body is
/// read by its `Content-Length` (which `crate::http` does not do).
fn webdriver_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to chromedriver");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send to chromedriver");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)
        .expect("read chromedriver's status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"));
    let mut length = 0;
    loop {
        line.clear();
        r.read_line(&mut line).expect("read chromedriver's headers");
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().expect("a Content-Length");
            }
        }
    }
    let mut bytes = vec![0; length];
    r.read_exact(&mut bytes).expect("read chromedriver's body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}
