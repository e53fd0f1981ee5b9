//! The photographs of test/data (provenance in test/data/README.md), embedded: shared by
//! the GPU tests that decode them (`#[path = "common/photos.rs"] mod photos;`).

/// (name, file bytes) of each photograph.
pub const PHOTOS: [(&str, &[u8]); 5] = [
    ("astronaut", include_bytes!("../data/astronaut.png")),
    ("chelsea", include_bytes!("../data/chelsea.png")),
    ("coffee", include_bytes!("../data/coffee.png")),
    ("rocket", include_bytes!("../data/rocket.jpg")),
    ("camera", include_bytes!("../data/camera.png")),
];
