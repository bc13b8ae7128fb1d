// The key range a decode row attends to and how attention_decode.comp splits
// it; attention_combine.comp recomputes the same split to know which
// partials exist. Only n_split (how many workgroups may take a share) is
// fixed when a pass is recorded; the split length follows the row's actual
// span, read from the positions buffer, so a short context uses one or a few
// splits instead of paying for the whole capacity, and a recorded pass stays
// valid for every position.
const uint SPLIT_MIN = 32u; // keys per split at least (one key tile; vk/ops/attention.rs)

struct Span {
    uint start;    // first key attended
    uint end;      // one past the last
    uint len;      // keys per split (the last may have fewer)
    uint n_active; // splits that hold keys: [0, n_active)
};

Span decode_span(uint p, uint capacity, uint window, uint n_split) {
    Span s;
    s.end = min(p + 1u, capacity);
    uint start = (window > 0u && p + 1u > window) ? p + 1u - window : 0u;
    s.start = min(start, s.end);
    uint span = s.end - s.start;
    uint len = max((span + n_split - 1u) / n_split, SPLIT_MIN);
    s.len = (len + SPLIT_MIN - 1u) / SPLIT_MIN * SPLIT_MIN;
    s.n_active = (span + s.len - 1u) / s.len;
    return s;
}

// A split prefill pass (attention_prefill_coopmat.comp with n_split > 1)
// cuts the keys into n_split chunks of the length this returns: the span of
// the last row (prefill rows ascend) shared out, at least min_keys, a
// multiple of 32 (the kernel's key tile). The last chunk also takes any key
// past the others, so every key belongs to exactly one chunk whatever the
// positions.
uint prefill_chunk_len(uint last_pos, uint capacity, uint n_split, uint min_keys) {
    uint end = min(last_pos + 1u, capacity);
    uint len = max((end + n_split - 1u) / n_split, min_keys);
    return (len + 31u) / 32u * 32u;
}

uint prefill_chunk_of(uint key, uint len, uint n_split) {
    return min(key / len, n_split - 1u);
}
