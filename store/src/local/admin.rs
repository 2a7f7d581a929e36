//! The local store's reports, jobs, faults and figures (its [`StoreAdmin`]).

use super::*;
use packrat_store_api::reports::{CompactReport, JobProgress, Progress, TierStatus};

#[async_trait::async_trait]
impl StoreAdmin for LocalStore {
    async fn status(&self, flush: bool) -> StoreResult<Report> {
        if flush {
            self.run(|e| Ok(e.index.flush_and_compact_objects()?))
                .await?;
        }
        Ok(crate::admin::report(&crate::admin::status(&self.engine))?)
    }

    async fn compact(
        &self,
        threshold: f64,
        grace: std::time::Duration,
    ) -> StoreResult<CompactReport> {
        Ok(crate::compact::compact(&self.engine, threshold, grace, None).await?)
    }

    fn start_job(&self, job: JobStart) -> StoreResult<JobProgress> {
        match job {
            JobStart::Scrub => {
                if !self.engine.chunks.has_redundancy() {
                    return Err(StoreError::Invalid(
                        "scrub needs erasure coding (serve with --disk ... --ec K+M)".into(),
                    ));
                }
                crate::ec::start_scrub(&self.engine, None);
            }
            JobStart::TierRun { days_ahead } => {
                crate::tier::ask_run(&self.engine, days_ahead);
            }
            JobStart::Compact { threshold, grace } => {
                crate::compact::start(&self.engine, threshold, grace);
            }
        }
        self.job_progress(job.kind())
    }

    fn job_progress(&self, job: JobKind) -> StoreResult<JobProgress> {
        Ok(match job {
            JobKind::Scrub => {
                let p = self.engine.scrub.progress();
                JobProgress::Scrub(Progress {
                    running: p.running,
                    done_bytes: p.done_bytes,
                    total_bytes: p.total_bytes,
                    finished_runs: p.finished_runs,
                    report: p.report.map(crate::ec::scrub_report),
                    error: p.error,
                })
            }
            JobKind::TierRun => JobProgress::TierRun(self.engine.tiers.progress()),
            JobKind::Compact => JobProgress::Compact(self.engine.compaction_job.progress()),
        })
    }

    async fn tier_status(&self) -> StoreResult<TierStatus> {
        Ok(crate::tier::status(&self.engine).await?)
    }

    async fn faults(&self, set: Option<Report>) -> StoreResult<Report> {
        let Some(faults) = &self.faults else {
            return Err(StoreError::Invalid(
                "fault injection is off (packrat serve --fault-injection)".into(),
            ));
        };
        Ok(crate::admin::faults(faults, set)?)
    }

    fn metrics(&self) -> Vec<Metric> {
        crate::admin::metrics(&self.engine)
    }

    fn write_readiness(&self) -> Result<(), String> {
        self.engine.chunks.write_readiness()
    }
}
