//! devicelet-cel (skeleton; filled in by its owner).
