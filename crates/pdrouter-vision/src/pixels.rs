//! [`Rgb8`]: an 8-bit RGB image, rows top to bottom, pixels left to right, `R G B` per pixel.

/// An 8-bit RGB image held in one buffer.
///
/// Invariant: `data.len() == width * height * 3`.
#[derive(Clone, PartialEq, Eq)]
pub struct Rgb8 {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for Rgb8 {
    /// The size only: the pixels would fill a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rgb8({}x{})", self.width, self.height)
    }
}

impl Rgb8 {
    /// An image from its pixels.
    ///
    /// # Panics
    /// If `data` does not hold exactly `width * height` pixels (a caller's bug, never input).
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Self {
        assert_eq!(data.len(), width * height * 3, "RGB buffer size");
        Rgb8 {
            width,
            height,
            data,
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// All pixels, `R G B` each, row after row.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Row `y`'s pixels.
    pub fn row(&self, y: usize) -> &[u8] {
        &self.data[y * self.width * 3..(y + 1) * self.width * 3]
    }
}
