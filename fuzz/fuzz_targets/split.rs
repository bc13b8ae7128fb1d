//! Inputs that carry two parts: a little-endian u16 length, that many bytes
//! of the first part (a text), then the second part (a file image). Seeds in
//! fuzz/seeds are written in this layout by fuzz/make_seeds.py.

/// (first part as text, second part); `None` when the input is too short.
pub fn split(data: &[u8]) -> Option<(String, &[u8])> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (head, tail) = rest.split_at(len);
    Some((String::from_utf8_lossy(head).into_owned(), tail))
}
