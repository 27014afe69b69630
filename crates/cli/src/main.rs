//! The `zinfer` command.

mod bench;

fn main() {
    println!("zinfer");
}
