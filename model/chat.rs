//! Chat templates: the Jinja templates shipped with models (GGUF
//! `tokenizer.chat_template`, `tokenizer_config.json`), rendered with the
//! variables and settings Hugging Face transformers uses.

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Renders `template` over `messages` as transformers' `apply_chat_template`
/// does: `trim_blocks` and `lstrip_blocks` on, `raise_exception` and a
/// Python-style `tojson` available, Python string/dict methods (`.strip()`,
/// `.startswith()`, `.items()`, ...) supported. A `raise_exception(msg)` in
/// the template becomes [`Error::Template`] carrying `msg`.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| Error::Template(format!("cannot parse the template: {}", one_line(&e))))?;
    let mut out = CappedOutput(Vec::new());
    tmpl.render_captured_to(
        minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        },
        &mut out,
    )
    .map_err(|e| Error::Template(format!("cannot render: {}", one_line(&e))))?;
    // minijinja writes whole `str`s, so the text is UTF-8 whatever the input.
    String::from_utf8(out.0)
        .map_err(|_| Error::Template("cannot render: the output is not UTF-8".into()))
}

/// Template instructions one render may run. Real templates take a few
/// hundred per message; this bounds a template that loops for ever (nested
/// `range` loops) to about a second instead.
const RENDER_FUEL: u64 = 20_000_000;

/// The most a rendered prompt may hold: far beyond any context length, and
/// it stops a template that prints without end before it exhausts memory.
const MAX_RENDERED_BYTES: usize = 64 << 20;

/// The render's output, refusing to grow past [`MAX_RENDERED_BYTES`].
struct CappedOutput(Vec<u8>);

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(format!(
                "the prompt would exceed {} MiB",
                MAX_RENDERED_BYTES >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A minijinja error and its causes as one line: its alternate form adds a
/// multi-line source excerpt for syntax errors, and errors are printed as
/// one `error:` line.
fn one_line(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text.replace('\n', " ")
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and
/// `": "` separators, non-ASCII kept, no HTML escaping (unlike minijinja's
/// built-in `tojson`, which escapes `<` and `>` for HTML).
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter,
        )),
    };
    written.map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(e)
    })?;
    String::from_utf8(out).map(Value::from).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "JSON output is not UTF-8")
            .with_source(e)
    })
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
