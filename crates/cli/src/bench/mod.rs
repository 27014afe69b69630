//! `zinfer bench`: a serving benchmark over the real protocol.
