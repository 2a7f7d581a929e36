//! The XML request bodies (DeleteObjects, CompleteMultipartUpload, CreateBucketConfiguration):
//! MalformedXML or a parsed document, never a panic.
#![no_main]

#[allow(dead_code)]
#[path = "../../gateway/src/s3/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../../gateway/src/s3/xml.rs"]
mod xml;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = xml::parse::<xml::Delete>(data);
    let _ = xml::parse::<xml::CompleteMultipartUpload>(data);
    let _ = xml::parse::<xml::CreateBucketConfiguration>(data);
});
