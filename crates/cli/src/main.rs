//! The `zinfer` command.

fn main() {
    println!("zinfer");
}
