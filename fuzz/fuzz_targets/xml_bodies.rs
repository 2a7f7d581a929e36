//! The XML request bodies (DeleteObjects, CompleteMultipartUpload, CreateBucketConfiguration,
//! PutObjectTagging, PutBucketLifecycleConfiguration): MalformedXML or a parsed document, never
//! a panic. Tag sets and lifecycle rules that parse are written back as packrat answers them
//! and must parse again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::{lifecycle, tagging, xml};

fuzz_target!(|data: &[u8]| {
    let _ = xml::parse::<xml::Delete>(data);
    let _ = xml::parse::<xml::CompleteMultipartUpload>(data);
    let _ = xml::parse::<xml::CreateBucketConfiguration>(data);
    if let Ok(tags) = tagging::parse_xml(data) {
        let again = tagging::parse_xml(tagging::to_xml(&tags).finish().as_bytes());
        assert_eq!(again.expect("packrat's own tagging answer parses"), tags);
    }
    let is_tier = |c: &str| c == "COLD";
    if let Ok(rules) = lifecycle::parse(data, &is_tier) {
        let again = lifecycle::parse(lifecycle::to_xml(&rules).as_bytes(), &is_tier);
        assert_eq!(again.expect("packrat's own lifecycle answer parses"), rules);
    }
});
