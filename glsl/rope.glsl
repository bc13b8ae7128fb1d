// cos and sin of the rotary angle p * inv_freq. The angle is reduced to
// [-pi, pi] first: GPU sin/cos lose accuracy on large arguments (position
// 1000 and up). 2*pi = 6.28125 (8 bits, so t * it is exact) +
// 0.0019353071795864769 (Cody-Waite, no fma needed).
vec2 rope_rotation(uint p, float inv_freq) {
    precise float theta = float(p) * inv_freq;
    precise float t = round(theta * 0.15915494309189535);
    precise float r = (theta - t * 6.28125) - t * 0.0019353071795864769;
    return vec2(cos(r), sin(r));
}

// Pairs are (i, i + rot_dim/2) with NeoX, else (2i, 2i + 1); values past
// rot_dim pass unrotated.

// The frequency index of element d (< rot_dim) of a head.
uint rope_freq(uint d, uint rot_dim, bool neox) {
    return neox ? d % (rot_dim / 2u) : d / 2u;
}

// The index of element d's pair partner within its head.
uint rope_mate(uint d, uint rot_dim, bool neox) {
    uint half_rot = rot_dim / 2u;
    if (d >= rot_dim) {
        return d;
    }
    if (neox) {
        return d < half_rot ? d + half_rot : d - half_rot;
    }
    return (d & 1u) == 0u ? d + 1u : d - 1u;
}

// Element d of a head rotated by cs = (cos, sin) of its frequency, from its
// own value and its pair partner's.
float rope_apply(uint d, float val, float mate, vec2 cs, uint rot_dim, bool neox) {
    if (d >= rot_dim) {
        return val;
    }
    bool first = neox ? d < rot_dim / 2u : (d & 1u) == 0u;
    float x0 = first ? val : mate;
    float x1 = first ? mate : val;
    return first ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
}
