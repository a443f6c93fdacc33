//! devicelet-checkpoint (skeleton; filled in by its owner).
