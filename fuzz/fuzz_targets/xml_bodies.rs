//! The XML request bodies (DeleteObjects, CompleteMultipartUpload, CreateBucketConfiguration):
//! MalformedXML or a parsed document, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::xml;

fuzz_target!(|data: &[u8]| {
    let _ = xml::parse::<xml::Delete>(data);
    let _ = xml::parse::<xml::CompleteMultipartUpload>(data);
    let _ = xml::parse::<xml::CreateBucketConfiguration>(data);
});
