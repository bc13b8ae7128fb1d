//! Text through the C API: tokenize, detokenize, the chat template. Text
//! comes back NUL-terminated in a caller's buffer; too small a buffer gives
//! `VKLLM_STATUS_BUFFER_TOO_SMALL` with the needed length (without the NUL).

use super::{copy_out, guard, handle, put, slice_arg, str_arg, Fail, VkllmModel, VkllmStatus};
use crate::model::chat::{render_chat, ChatMessage};
use std::ffi::c_char;

/// One chat message (UTF-8, NUL-terminated strings).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VkllmChatMessage {
    pub role: *const c_char,
    pub content: *const c_char,
}

/// Writes `text` and a NUL into `out` (capacity `cap` bytes); `*len` is the
/// text's length.
///
/// # Safety
/// `out` points to `cap` writable bytes; `len` is null or writable.
unsafe fn text_out(text: &str, out: *mut c_char, cap: usize, len: *mut usize) -> Result<(), Fail> {
    // SAFETY: forwarded.
    unsafe { put(len, text.len()) };
    if text.len() >= cap {
        return Err(Fail::TooSmall(format!(
            "the text needs {} bytes and a NUL, the buffer holds {cap}",
            text.len()
        )));
    }
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: `cap > text.len()` bytes are writable.
    unsafe { copy_out(&bytes, out.cast::<u8>(), cap, std::ptr::null_mut()) }
}

/// The ids of `text` into `out` (capacity `cap`); `*n` is their count.
/// `add_bos`: prepend BOS when the model's tokenizer asks for one.
///
/// # Safety
/// `m` is a live handle, `text` NUL-terminated, `out` holds `cap` values,
/// `n` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_tokenize(
    m: *mut VkllmModel,
    text: *const c_char,
    add_bos: bool,
    out: *mut u32,
    cap: usize,
    n: *mut usize,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, text) = unsafe { (handle(m)?, str_arg(text, "text")?) };
        let tok = m.tokenizer()?;
        let ids = tok.encode(text, add_bos && tok.add_bos_by_default())?;
        // SAFETY: per the contract.
        unsafe { copy_out(&ids, out, cap, n) }
    })
}

/// The text of `n` ids into `out` (capacity `cap` bytes, NUL included).
///
/// # Safety
/// `m` is a live handle, `ids` holds `n` values, `out` `cap` bytes, `len`
/// is null or writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_detokenize(
    m: *mut VkllmModel,
    ids: *const u32,
    n: usize,
    out: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, ids) = unsafe { (handle(m)?, slice_arg(ids, n, "ids")?) };
        let text = m.tokenizer()?.decode(ids)?;
        // SAFETY: per the contract.
        unsafe { text_out(&text, out, cap, len) }
    })
}

/// The model's chat template over `n` messages, ending with the
/// assistant's turn when `add_generation_prompt`; tokenize the result with
/// `add_bos` false (the template writes its own special tokens).
///
/// # Safety
/// `m` is a live handle, `messages` holds `n` messages of valid strings,
/// `out` `cap` bytes, `len` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_apply_chat_template(
    m: *mut VkllmModel,
    messages: *const VkllmChatMessage,
    n: usize,
    add_generation_prompt: bool,
    out: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, messages) = unsafe { (handle(m)?, slice_arg(messages, n, "messages")?) };
        let msgs = messages
            .iter()
            .map(|msg| {
                // SAFETY: valid strings, per the contract.
                let (role, content) = unsafe {
                    (
                        str_arg(msg.role, "a role")?,
                        str_arg(msg.content, "a content")?,
                    )
                };
                Ok(ChatMessage::new(role, content))
            })
            .collect::<Result<Vec<_>, Fail>>()?;
        let tok = m.tokenizer()?;
        let template = tok
            .chat_template()
            .ok_or_else(|| Fail::Arg("the model has no chat template".into()))?;
        let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_piece(i)).unwrap_or_default();
        let text = render_chat(
            template,
            &msgs,
            add_generation_prompt,
            &piece(tok.bos_id()),
            &piece(tok.eos_id()),
        )?;
        // SAFETY: per the contract.
        unsafe { text_out(&text, out, cap, len) }
    })
}
