//! How a gateway keeps up with the cluster: the map and the buckets, followed in etcd.

use super::*;

impl ClusterStore {
    pub async fn connect(etcd: Etcd) -> Result<Arc<ClusterStore>, String> {
        Self::connect_as(etcd, None).await
    }

    /// The store of a node's S3 read endpoint, in the node's process (see [`Beside`]): it
    /// reads what the node holds from the node itself, in-process, and answers a request for
    /// anything else as misdirected.
    pub(crate) async fn connect_beside(
        etcd: Etcd,
        beside: Beside,
    ) -> Result<Arc<ClusterStore>, String> {
        Self::connect_as(etcd, Some(beside)).await
    }

    async fn connect_as(etcd: Etcd, beside: Option<Beside>) -> Result<Arc<ClusterStore>, String> {
        let trust = crate::Trust::of(&etcd).await?;
        let master = packrat_secrets::master_key::MasterKey::from_bytes(&etcd.master_key().await?);
        let map = etcd.follow_map().await?;
        let mut client = NodeClient::new(&trust);
        if let Some(b) = &beside {
            client = client.beside(b.addr.clone(), b.handler.clone());
        }
        let store = Arc::new_cyclic(|me| ClusterStore {
            beside,
            me: me.clone(),
            master,
            relay: crate::relay::Relay::new(client.clone()),
            client,
            etcd,
            map,
            buckets: Arc::default(),
            keys: Arc::default(),
            kms: Default::default(),
            next_reader: AtomicUsize::new(0),
            gathers: RwLock::default(),
            gathered_lookups: AtomicU64::new(0),
            gathered_requests: AtomicU64::new(0),
            gathered_alone: AtomicU64::new(0),
            local_edits: AtomicU64::new(0),
            misses: Default::default(),
            etcd_misses_asked: AtomicU64::new(0),
            etcd_heard_ms: AtomicU64::new(crate::now_ms()),
            clock: Arc::new(SystemClock),
        });
        store.reload().await?;
        let follower = store.clone();
        tokio::spawn(async move { follower.follow().await });
        tokio::spawn(Self::hear_etcd(Arc::downgrade(&store)));
        Ok(store)
    }

    /// Asks etcd how it is every second while the store lives, noting when it last answered
    /// (see [`ClusterStore::etcd_silent`]).
    pub(super) async fn hear_etcd(me: std::sync::Weak<ClusterStore>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(me) = me.upgrade() else { return };
            let mut client = me.etcd.client.clone();
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), client.status()).await {
                me.etcd_heard_ms.store(crate::now_ms(), Ordering::Relaxed);
            }
        }
    }

    /// Whether etcd has not answered this gateway for longer than a node's fence time: then
    /// no new map can reach it (a partition that left it without etcd), and waiting for a
    /// failover only keeps clients waiting.
    pub(super) fn etcd_silent(&self) -> bool {
        crate::now_ms().saturating_sub(self.etcd_heard_ms.load(Ordering::Relaxed)) > crate::FENCE_MS
    }

    /// Replaces the bucket and key caches (and the KMS ring) with etcd's records. A change this gateway made
    /// while the listing was under way (a PutBucketCors answered, then read back at once)
    /// may be missing from the listing, so the caches are replaced only if no local change
    /// was counted since the listing began; otherwise it lists again.
    pub(super) async fn reload(&self) -> Result<(), String> {
        for _ in 0..64 {
            let before = self.local_edits.load(Ordering::SeqCst);
            let buckets: HashMap<String, BucketRecord> = bucket_records(&self.etcd)
                .await?
                .into_iter()
                .map(|b| (b.name.clone(), b))
                .collect();
            let keys: HashMap<String, AccessKey> = self
                .etcd
                .list("keys/")
                .await?
                .iter()
                .filter_map(|(_, v)| serde_json::from_slice::<AccessKey>(v).ok())
                .map(|k| (k.access_key.clone(), k))
                .collect();
            let kms = super::kms::records(&self.etcd).await?;
            let (Ok(mut b), Ok(mut k)) = (self.buckets.write(), self.keys.write()) else {
                return Err("a bucket or key cache lock is poisoned".into());
            };
            if self.local_edits.load(Ordering::SeqCst) == before {
                *b = buckets;
                *k = keys;
                self.misses.forget_all();
                for bad in self.kms.replace(&self.master, &kms) {
                    tracing::error!("{bad}: its objects cannot be read");
                }
                return Ok(());
            }
        }
        Err("the caches kept changing while they were reloaded".into())
    }

    /// A change to the bucket cache after a write to etcd, counted (see `local_edits`).
    pub(super) fn edit_bucket_cache(&self, f: impl FnOnce(&mut HashMap<String, BucketRecord>)) {
        if let Ok(mut b) = self.buckets.write() {
            f(&mut b);
            self.local_edits.fetch_add(1, Ordering::SeqCst);
        }
        self.misses.forget_all();
    }

    /// An etcd record for a name the caches do not hold, unless etcd lately had none (see
    /// `misses`): `what` is the key's folder (`buckets`, `keys`).
    pub(super) fn uncached(&self, what: &str, name: &str) -> StoreResult<Option<Vec<u8>>> {
        let id = format!("{what}/{name}");
        let now = Instant::now();
        if self.misses.fresh(&id, now) {
            return Ok(None);
        }
        self.etcd_misses_asked.fetch_add(1, Ordering::Relaxed);
        let found = self
            .blocking(self.etcd.get(&id))
            .map_err(StoreError::Unavailable)?;
        if found.is_none() {
            self.misses.note(&id, now);
        }
        Ok(found.map(|(v, _)| v))
    }

    /// Reloads buckets, access keys and KMS keys whenever they change in etcd.
    pub(super) async fn follow(self: Arc<Self>) {
        loop {
            let watched = async {
                let mut stream = self
                    .etcd
                    .client
                    .clone()
                    .watch(
                        crate::map::PREFIX,
                        Some(etcd_client::WatchOptions::new().with_prefix()),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                self.reload().await?;
                while let Some(resp) = stream.message().await.map_err(|e| e.to_string())? {
                    let relevant = resp.events().iter().any(|ev| {
                        ev.kv().is_some_and(|kv| {
                            let k = String::from_utf8_lossy(kv.key());
                            let k = k.trim_start_matches(crate::map::PREFIX);
                            k.starts_with("buckets/")
                                || k.starts_with("keys/")
                                || k.starts_with("kms/")
                        })
                    });
                    if relevant {
                        self.reload().await?;
                    }
                }
                Ok::<(), String>(())
            };
            if let Err(e) = watched.await {
                tracing::warn!("following buckets and keys in etcd: {e}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Runs an etcd read from a synchronous trait method (a cache miss).
    pub(super) fn blocking<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
    }

    pub(crate) fn map(&self) -> Arc<ClusterMap> {
        self.map.borrow().clone()
    }
}
