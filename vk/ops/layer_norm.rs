//! `layer_norm` (glsl/layer_norm.comp): one workgroup per row.

use super::Encoder;
use super::{plain, read, write};
use crate::backend::{check, Buffer};
use crate::error::Result;

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vk) fn encode_layer_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        b: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layer_norm";
        let push = Self::norm_push(OP, x, out, rows, dim, eps)?;
        check::fits(OP, "w", w, dim)?;
        check::fits(OP, "b", b, dim)?;
        if rows == 0 {
            return Ok(());
        }
        let groups = self.split_groups(OP, push.rows)?;
        self.dispatch(
            OP,
            plain("layer_norm"),
            &[read(x), read(w), read(b), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
