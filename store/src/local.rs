//! [`LocalStore`]: one node's engine behind the [`ObjectStore`] trait, the store `packrat
//! serve` runs. It converts between the index's records and the trait's types and runs
//! blocking index work off the async threads; the write protocol itself stays in
//! [`crate::engine`].

use crate::engine::{Engine, blocking};
use crate::error::EngineResult;
use packrat_index::{BucketRecord, KeyRecord, ObjectRecord};
use packrat_store_api::lifecycle::Rule;
use packrat_store_api::{
    Bucket, Identity, ListQuery, NewBucket, ObjectPage, ObjectStore, ObjectSummary, StoreResult,
};
use std::sync::Arc;

pub struct LocalStore {
    engine: Arc<Engine>,
}

impl LocalStore {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    /// Runs blocking engine work on the blocking pool and answers in the trait's error type.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine) -> EngineResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let engine = self.engine.clone();
        Ok(blocking(move || f(&engine)).await?)
    }
}

fn bucket_of(r: BucketRecord) -> Bucket {
    Bucket {
        id: r.id,
        name: r.name,
        owner_id: r.owner_id,
        owner_name: r.owner_name,
        created_ms: r.created_ms,
        public_read: r.public_read,
    }
}

fn record_of(b: &Bucket) -> BucketRecord {
    BucketRecord {
        id: b.id,
        name: b.name.clone(),
        owner_id: b.owner_id.clone(),
        owner_name: b.owner_name.clone(),
        created_ms: b.created_ms,
        public_read: b.public_read,
    }
}

fn identity_of(k: KeyRecord) -> Identity {
    Identity {
        access_key: k.access_key,
        secret_key: k.secret_key,
        name: k.name,
        owner_id: k.owner_id,
        is_root: k.is_root,
    }
}

fn summary_of(key: String, o: &ObjectRecord) -> ObjectSummary {
    ObjectSummary {
        key,
        size: o.size,
        etag: o.etag.clone(),
        last_modified_ms: o.last_modified_ms,
        checksum: o
            .checksum
            .as_ref()
            .map(|c| (c.algorithm.clone(), c.kind.clone())),
        storage_class: o.storage_class.clone(),
    }
}

#[async_trait::async_trait]
impl ObjectStore for LocalStore {
    fn access_key(&self, access_key: &str) -> StoreResult<Option<Identity>> {
        Ok(self.engine.access_key(access_key)?.map(identity_of))
    }

    fn bucket(&self, name: &str) -> StoreResult<Option<Bucket>> {
        Ok(self.engine.bucket(name)?.map(bucket_of))
    }

    async fn list_buckets(&self) -> StoreResult<Vec<Bucket>> {
        self.run(|e| Ok(e.index.list_buckets()?))
            .await
            .map(|v| v.into_iter().map(bucket_of).collect())
    }

    async fn create_bucket(&self, new: NewBucket) -> StoreResult<Bucket> {
        let name = new.name.clone();
        let created = self
            .run(move |e| {
                Ok(e.index
                    .create_bucket(&new.name.clone(), |id| BucketRecord {
                        id,
                        name: new.name,
                        owner_id: new.owner_id,
                        owner_name: new.owner_name,
                        created_ms: new.created_ms,
                        public_read: new.public_read,
                    })?)
            })
            .await;
        self.engine.forget_bucket(&name);
        created.map(bucket_of)
    }

    async fn delete_bucket(&self, bucket: &Bucket) -> StoreResult<()> {
        let (name, id) = (bucket.name.clone(), bucket.id);
        let deleted = self
            .run(move |e| {
                e.index.delete_bucket(&name)?;
                // Bucket ids are never reused; its lifecycle configuration goes with it.
                crate::tier::delete_lifecycle(&e.index, id)
            })
            .await;
        self.engine.forget_bucket(&bucket.name);
        deleted
    }

    async fn set_bucket_public(&self, bucket: &Bucket, public: bool) -> StoreResult<()> {
        let mut rec = record_of(bucket);
        rec.public_read = public;
        let updated = self.run(move |e| Ok(e.index.update_bucket(&rec)?)).await;
        self.engine.forget_bucket(&bucket.name);
        updated
    }

    async fn put_lifecycle(&self, bucket: &Bucket, rules: Vec<Rule>) -> StoreResult<()> {
        let id = bucket.id;
        self.run(move |e| crate::tier::put_lifecycle(&e.index, id, &rules))
            .await
    }

    async fn get_lifecycle(&self, bucket: &Bucket) -> StoreResult<Option<Vec<Rule>>> {
        let id = bucket.id;
        self.run(move |e| crate::tier::get_lifecycle(&e.index, id))
            .await
    }

    async fn delete_lifecycle(&self, bucket: &Bucket) -> StoreResult<()> {
        let id = bucket.id;
        self.run(move |e| crate::tier::delete_lifecycle(&e.index, id))
            .await
    }

    fn is_storage_class(&self, class: &str) -> bool {
        class == "STANDARD" || crate::tier::is_tier_class(class)
    }

    async fn list_objects(&self, bucket: &Bucket, query: &ListQuery) -> StoreResult<ObjectPage> {
        let (id, q) = (bucket.id, query.clone());
        self.run(move |e| {
            let page = e.index.list_objects(
                id,
                &q.prefix,
                q.delimiter.as_deref(),
                q.after.as_deref(),
                q.max_keys,
            )?;
            Ok(ObjectPage {
                objects: page
                    .objects
                    .into_iter()
                    .map(|(k, o)| summary_of(k, &o))
                    .collect(),
                common_prefixes: page.common_prefixes,
                truncated: page.truncated,
                last: page.last,
            })
        })
        .await
    }
}
