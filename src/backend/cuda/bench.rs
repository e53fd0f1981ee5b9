//! `vision_preproc bench` (placeholder, filled below).
