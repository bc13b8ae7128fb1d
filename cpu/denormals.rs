//! Denormal floats flushed to zero while the backend computes. Intel cores
//! take a microcode assist of ~100+ cycles for each operation that makes or
//! reads a denormal; a random-weight model (`vkllm synth --fast`) makes
//! many in its activations, and on a 16-core Xeon the SwiGLU of a prefill
//! ran at a twentieth of its speed on an AMD core. Values below 1.2e-38 do
//! not change a model's output.

/// The thread's floating-point control while alive, the previous one back
/// on drop (the host thread's mode is the host's).
pub(crate) struct FlushDenormals {
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    saved: u64,
}

impl FlushDenormals {
    pub fn new() -> FlushDenormals {
        let saved = read();
        write(saved | FLUSH);
        FlushDenormals { saved }
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        write(self.saved);
    }
}

/// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
#[cfg(target_arch = "x86_64")]
const FLUSH: u64 = 0x8040;
/// FPCR's FZ (bit 24).
#[cfg(target_arch = "aarch64")]
const FLUSH: u64 = 1 << 24;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FLUSH: u64 = 0;

#[cfg(target_arch = "x86_64")]
fn read() -> u64 {
    let mut csr = 0u32;
    // SAFETY: stores MXCSR into a live local.
    unsafe { core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    csr as u64
}

#[cfg(target_arch = "x86_64")]
fn write(v: u64) {
    let csr = v as u32;
    // SAFETY: loads a valid MXCSR value (read from the register, with the
    // two flush bits set or restored).
    unsafe { core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly)) };
}

#[cfg(target_arch = "aarch64")]
fn read() -> u64 {
    let v: u64;
    // SAFETY: reads the floating-point control register.
    unsafe { core::arch::asm!("mrs {}, fpcr", out(reg) v, options(nomem, nostack)) };
    v
}

#[cfg(target_arch = "aarch64")]
fn write(v: u64) {
    // SAFETY: writes back the control register as read, FZ set or restored.
    unsafe { core::arch::asm!("msr fpcr, {}", in(reg) v, options(nomem, nostack)) };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn read() -> u64 {
    0
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn write(_: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denormals_flush_inside_and_not_after() {
        let tiny = std::hint::black_box(1e-30f32);
        let scale = std::hint::black_box(1e-10f32);
        assert!(tiny * scale > 0.0, "a denormal product without the guard");
        {
            let _g = FlushDenormals::new();
            if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
                assert_eq!(
                    std::hint::black_box(tiny) * std::hint::black_box(scale),
                    0.0
                );
            }
        }
        assert!(std::hint::black_box(tiny) * std::hint::black_box(scale) > 0.0);
    }
}
