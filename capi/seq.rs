//! Several sequences on one model through the C API: each has its own KV
//! pages, and one call decodes a step of many at once (model/batch.rs).
//! The handle's own sequence (`vkllm_eval`, `vkllm_generate`) is apart from
//! these.

use super::{guard, handle, put, slice_arg, Fail, VkllmModel, VkllmStatus};
use crate::model::{Output, SeqId, Want};

/// Starts a sequence for `prompt` (`n` ids), reusing the KV pages of the
/// longest cached prefix of whole pages another sequence evaluated: writes
/// its id to `*seq` and how many prompt ids need no evaluation to
/// `*reused` (may be NULL). Evaluate the rest with `vkllm_seq_eval`.
///
/// # Safety
/// `m` is a live handle, `prompt` points to `n` values, `seq` is writable,
/// `reused` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_seq_add(
    m: *mut VkllmModel,
    prompt: *const u32,
    n: usize,
    seq: *mut u64,
    reused: *mut usize,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, prompt) = unsafe { (handle(m)?, slice_arg(prompt, n, "prompt")?) };
        if seq.is_null() {
            return Err(Fail::Arg("seq is null".into()));
        }
        let (id, r) = m.model.add_sequence(prompt)?;
        // SAFETY: writable, per the contract.
        unsafe {
            put(seq, id.to_raw());
            put(reused, r);
        }
        Ok(())
    })
}

/// Appends `n` ids to sequence `seq`; writes the greedy next id to `*next`
/// (may be NULL) and, when `logits` is not NULL, the logits after the last
/// id (`vkllm_n_vocab` values).
///
/// # Safety
/// `m` is a live handle, `ids` points to `n` values, `next` is null or
/// writable, `logits` is null or holds `vkllm_n_vocab` writable values.
#[no_mangle]
pub unsafe extern "C" fn vkllm_seq_eval(
    m: *mut VkllmModel,
    seq: u64,
    ids: *const u32,
    n: usize,
    next: *mut u32,
    logits: *mut f32,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, ids) = unsafe { (handle(m)?, slice_arg(ids, n, "ids")?) };
        let want = if logits.is_null() {
            Want::Argmax
        } else {
            Want::LastLogits
        };
        let out = m.model.prefill(SeqId::from_raw(seq), ids, want)?;
        // SAFETY: per the contract.
        unsafe { write_out(out, next, logits) };
        Ok(())
    })
}

/// One decode step of `n` sequences in one pass: row `i` appends
/// `tokens[i]` to sequence `seqs[i]` and writes its greedy next id to
/// `next[i]` (may be NULL) and, when `logits` is not NULL, its logits to
/// `logits[i * vocab ..]`. Each sequence at most once; at most the load
/// option `sequences` rows. On a failure every sequence is as before.
///
/// # Safety
/// `m` is a live handle; `seqs` and `tokens` point to `n` values; `next`
/// is null or holds `n` writable values; `logits` is null or holds
/// `n * vkllm_n_vocab` writable values.
#[no_mangle]
pub unsafe extern "C" fn vkllm_seq_decode(
    m: *mut VkllmModel,
    seqs: *const u64,
    tokens: *const u32,
    n: usize,
    next: *mut u32,
    logits: *mut f32,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, seqs, tokens) = unsafe {
            (
                handle(m)?,
                slice_arg(seqs, n, "seqs")?,
                slice_arg(tokens, n, "tokens")?,
            )
        };
        let rows: Vec<(SeqId, u32)> = seqs
            .iter()
            .zip(tokens)
            .map(|(&s, &t)| (SeqId::from_raw(s), t))
            .collect();
        let want = if logits.is_null() {
            Want::Argmax
        } else {
            Want::LastLogits
        };
        let vocab = m.model.config().vocab;
        for (i, out) in m.model.decode_rows(&rows, want)?.into_iter().enumerate() {
            // SAFETY: `next` holds n values and `logits` n * vocab, per the contract.
            unsafe {
                let row_next = if next.is_null() { next } else { next.add(i) };
                let row_logits = if logits.is_null() {
                    logits
                } else {
                    logits.add(i * vocab)
                };
                write_out(out, row_next, row_logits);
            }
        }
        Ok(())
    })
}

/// Ends sequence `seq`; its KV pages return to the pool (full ones stay
/// cached for prompts that share them).
///
/// # Safety
/// `m` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn vkllm_seq_free(m: *mut VkllmModel, seq: u64) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { handle(m) }?;
        m.model.free_sequence(SeqId::from_raw(seq))?;
        Ok(())
    })
}

/// A step's output as the C caller asked for it: the token, or the logits
/// and their argmax.
///
/// # Safety
/// `next` is null or writable; `logits` is null or holds the vocabulary's
/// values when `out` is logits.
unsafe fn write_out(out: Output, next: *mut u32, logits: *mut f32) {
    match out {
        Output::Token(t) => {
            // SAFETY: forwarded.
            unsafe { put(next, t) }
        }
        Output::Logits(l) => {
            // The first of ties, as the device's argmax.
            let best = l
                .iter()
                .enumerate()
                .fold(0, |b, (i, &x)| if x > l[b] { i } else { b });
            // SAFETY: forwarded; `logits` holds `l.len()` values.
            unsafe {
                put(next, best as u32);
                if !logits.is_null() {
                    std::ptr::copy_nonoverlapping(l.as_ptr(), logits, l.len());
                }
            }
        }
    }
}
