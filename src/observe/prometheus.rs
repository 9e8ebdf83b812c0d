//! The Prometheus recorder with this crate's histogram buckets.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use super::metrics::HISTOGRAM_BUCKETS;

/// A `metrics-exporter-prometheus` builder with [`HISTOGRAM_BUCKETS`] set, so that the
/// histograms [`Metrics`](super::Metrics) records render as Prometheus histograms
/// (`_bucket{le=…}`, `_sum`, `_count`, which `histogram_quantile` aggregates across processes)
/// instead of the exporter's default summaries. Go on configuring it as any
/// `PrometheusBuilder`, then install it once per process, before the first call:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let prometheus = tower_backstop::observe::prometheus_builder().install_recorder()?;
/// // Serve `prometheus.render()` on your `/metrics` route.
/// # let _ = prometheus;
/// # Ok(())
/// # }
/// ```
///
/// Buckets set later for the same names (`set_buckets_for_metric`) replace these.
pub fn prometheus_builder() -> PrometheusBuilder {
    HISTOGRAM_BUCKETS
        .iter()
        .fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder
                .set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
                .expect("the buckets are not empty")
        })
}
