//! Text held back while it may still become a tag, shared by the
//! reasoning stage and the tool formats' parsers.

/// The length of the longest end of `text` that is a proper start of
/// `tag`: text that may still become the tag. Tags are ASCII, so what is
/// left before it ends on a character boundary.
pub(super) fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}
