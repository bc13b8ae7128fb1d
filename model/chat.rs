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
/// does: `trim_blocks` and `lstrip_blocks` on, `raise_exception`,
/// `strftime_now` and a Python-style `tojson` available, Python string/dict
/// methods (`.strip()`, `.startswith()`, `.items()`, ...) supported. A `raise_exception(msg)` in
/// the template becomes [`Error::Template`] carrying `msg`.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let opts = RenderOptions {
        add_generation_prompt,
        bos_token,
        eos_token,
        tools: None,
    };
    render_values(template, Value::from_serialize(messages), &opts)
}

/// What a render passes the template besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    pub add_generation_prompt: bool,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// OpenAI function tools (`{"type": "function", "function": {...}}`),
    /// the template's `tools`; `None` renders `tools` as none, as
    /// transformers does without tools.
    pub tools: Option<&'a [serde_json::Value]>,
}

/// [`render_chat`] over messages of any shape (OpenAI's: assistant
/// messages with `tool_calls`, whose `function.arguments` templates expect
/// as an object; `tool` messages with `tool_call_id`), and with tools.
/// Object keys keep their order, as Python's dicts do, so `tojson` writes
/// what transformers writes.
pub fn render_chat_with(
    template: &str,
    messages: &[serde_json::Value],
    opts: &RenderOptions,
) -> Result<String> {
    render_values(template, Value::from_serialize(messages), opts)
}

fn render_values(template: &str, messages: Value, opts: &RenderOptions) -> Result<String> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| Error::Template(format!("cannot parse the template: {}", one_line(&e))))?;
    let tools = opts
        .tools
        .map(Value::from_serialize)
        .unwrap_or(Value::from(()));
    let mut out = CappedOutput(Vec::new());
    tmpl.render_captured_to(
        minijinja::context! {
            messages => messages,
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => opts.add_generation_prompt,
            bos_token => opts.bos_token,
            eos_token => opts.eos_token,
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

/// transformers' `strftime_now(format)`: the current time formatted as
/// Python's `strftime` does (gpt-oss writes "Current date: %Y-%m-%d", Llama
/// 3.1 "%d %b %Y"). In UTC, where transformers takes the local time.
fn strftime_now(format: String) -> std::result::Result<Value, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Value::from(strftime(&format, secs)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `format` for `unix_secs` (UTC), with the C library's common specifiers;
/// any other `%x` is kept as written, as glibc does.
fn strftime(format: &str, unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let weekday = ((days + 4) % 7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        match spec {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year % 100)),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:2}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'B' => out.push_str(MONTHS[month as usize - 1]),
            'b' | 'h' => out.push_str(&MONTHS[month as usize - 1][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a date from 1970 on (the inverse of
/// [`civil_from_days`]).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn strftime_formats_like_python() {
        // Expected strings from Python's datetime.strftime.
        let f = "%Y-%m-%d|%d %b %Y|%B %d, %Y|%A %a|%H:%M:%S|%I %p|%j|%y|%%|%e";
        for (secs, want) in [
            (
                1_721_999_109,
                "2024-07-26|26 Jul 2024|July 26, 2024|Friday Fri|13:05:09|01 PM|208|24|%|26",
            ),
            (
                1_709_164_800,
                "2024-02-29|29 Feb 2024|February 29, 2024|Thursday Thu|00:00:00|12 AM|060|24|%|29",
            ),
            (
                0,
                "1970-01-01|01 Jan 1970|January 01, 1970|Thursday Thu|00:00:00|12 AM|001|70|%| 1",
            ),
            (
                951_955_199,
                "2000-03-01|01 Mar 2000|March 01, 2000|Wednesday Wed|23:59:59|11 PM|061|00|%| 1",
            ),
            (
                1_704_024_000,
                "2023-12-31|31 Dec 2023|December 31, 2023|Sunday Sun|12:00:00|12 PM|365|23|%|31",
            ),
        ] {
            assert_eq!(strftime(f, secs), want, "{secs}");
        }
        assert_eq!(strftime("%Q and %", 0), "%Q and %");
    }
}
