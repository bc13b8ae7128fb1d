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
