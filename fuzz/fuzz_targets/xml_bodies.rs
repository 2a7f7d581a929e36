//! The XML request bodies (DeleteObjects, CompleteMultipartUpload, CreateBucketConfiguration,
//! PutObjectTagging and PutBucketTagging, PutBucketLifecycleConfiguration, PutBucketCors):
//! MalformedXML or a parsed document, never a panic. Tag sets, lifecycle and CORS rules that parse are written back as packrat answers them
//! and must parse again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::{cors, lifecycle, tagging, xml};

fuzz_target!(|data: &[u8]| {
    let _ = xml::parse::<xml::Delete>(data);
    let _ = xml::parse::<xml::CompleteMultipartUpload>(data);
    let _ = xml::parse::<xml::CreateBucketConfiguration>(data);
    let _ = xml::parse::<xml::ObjectLockConfiguration>(data);
    let _ = xml::parse::<xml::Retention>(data);
    let _ = xml::parse::<xml::LegalHold>(data);
    if let Ok(tags) = tagging::parse_xml(data) {
        let again = tagging::parse_xml(tagging::to_xml(&tags).finish().as_bytes());
        assert_eq!(again.expect("packrat's own tagging answer parses"), tags);
    }
    if let Ok(tags) = tagging::parse_bucket_xml(data) {
        let again = tagging::parse_bucket_xml(tagging::to_xml(&tags).finish().as_bytes());
        assert_eq!(again.expect("packrat's own bucket tagging answer parses"), tags);
    }
    if let Ok(rules) = cors::parse(data) {
        let again = cors::parse(cors::to_xml(&rules).finish().as_bytes());
        assert_eq!(again.expect("packrat's own CORS answer parses"), rules);
    }
    let is_tier = |c: &str| c == "COLD";
    if let Ok(rules) = lifecycle::parse(data, &is_tier) {
        let again = lifecycle::parse(lifecycle::to_xml(&rules).as_bytes(), &is_tier);
        assert_eq!(again.expect("packrat's own lifecycle answer parses"), rules);
    }
});
