//! Reading `VKLLM_*` environment variables: the parsers the options modules
//! (`vk::Options::from_env`, `cpu::CpuKernelOptions::from_env`) share. A
//! value a variable does not take is an [`Error::Setting`] naming it.

use crate::error::{Error, Result};

/// The variable `name`, trimmed; `None` when unset or blank.
pub(crate) fn setting(name: &'static str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Setting {
            name,
            value: v.to_string_lossy().into_owned(),
            expected: "text".into(),
        }),
    }
}

/// The value of the variable `name` among `words`, `None` when unset.
pub(crate) fn choice<T: Copy>(name: &'static str, words: &[(&str, T)]) -> Result<Option<T>> {
    setting(name)?.map(|v| pick(name, v, words)).transpose()
}

/// What `value` of the variable `name` means among `words` (any case).
fn pick<T: Copy>(name: &'static str, value: String, words: &[(&str, T)]) -> Result<T> {
    match words.iter().find(|(w, _)| w.eq_ignore_ascii_case(&value)) {
        Some(&(_, v)) => Ok(v),
        None => Err(Error::Setting {
            name,
            value,
            expected: format!(
                "one of {}",
                words.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// A count given in the variable `name`, `None` when unset.
pub(crate) fn count(name: &'static str) -> Result<Option<u64>> {
    let Some(value) = setting(name)? else {
        return Ok(None);
    };
    match value.parse() {
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(Error::Setting {
            name,
            value,
            expected: "a whole number".into(),
        }),
    }
}

/// `on` or `off`.
pub(crate) const ON_OFF: [(&str, bool); 2] = [("on", true), ("off", false)];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_word_outside_the_list_is_one_sentence_naming_the_variable() {
        assert!(!pick("VKLLM_DECODE_SPLITS", "OFF".into(), &ON_OFF).unwrap());
        let e = pick("VKLLM_DECODE_SPLITS", "maybe".into(), &ON_OFF).unwrap_err();
        assert_eq!(
            e.to_string(),
            "VKLLM_DECODE_SPLITS=maybe is not one of on, off"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
