//! The README's Rust example is `examples/hello.rs` (the crate's
//! documentation runs it as a doctest).

#[test]
fn the_readme_s_example_is_the_hello_example() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    let start = readme.find("```rust\n").expect("the README's Rust example") + "```rust\n".len();
    let end = start + readme[start..].find("```").expect("its end");
    assert_eq!(
        &readme[start..end],
        include_str!("../examples/hello.rs"),
        "the README's example is not rnic-verbs/examples/hello.rs"
    );
}
