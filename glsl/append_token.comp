// Greedy feedback between decode steps, one invocation: record the token the
// step chose and advance the position, so the next step (submitted back to
// back) embeds it at the next position with no host round trip.
#version 450

layout(local_size_x = 1) in;

layout(binding = 0) readonly buffer Ids { uint ids[]; };
layout(binding = 1) buffer Pos { uint pos[]; };
layout(binding = 2) buffer History { uint history[]; };

layout(push_constant) uniform Push {
    // Values `history` holds: the count, then up to len - 1 tokens.
    uint len;
} pc;

void main() {
    uint count = history[0];
    if (1u + count < pc.len) {
        history[1u + count] = ids[0];
    }
    history[0] = count + 1u;
    pos[0] += 1u;
}
