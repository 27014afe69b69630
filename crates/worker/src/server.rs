//! The worker's socket loop: talks to the router over a DEALER.
