//! packrat-tiering: moving sealed segments to an HDD directory or a cloud S3 bucket (issue 7).
//!
//! Not built yet: every object lives on the local (STANDARD) tier, and the README's
//! compatibility table says so. It will see segments only through the chunk store's API and
//! must never depend on the gateway.
