package gateway

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// metrics are the gateway's Prometheus series (served at GET /metrics). Names and labels:
//
//	ortbus_requests_total{op,class,pool,model,code}   terminal replies by outcome ("ok" or the error code); model: servedModel
//	ortbus_request_seconds{op,class}                  time from acceptance to the answer, of results (code ok)
//	ortbus_queue_wait_seconds{class,pool}             time from acceptance to the start of inference
//	ortbus_inference_seconds{class,pool,model}        inference time reported by the worker
//	ortbus_retries_total                              requests retried after their worker died
//	ortbus_queued{class}                              requests waiting in the gateway
//	ortbus_inflight{pool}                             requests dispatched and not yet answered
//	ortbus_worker_heartbeat_age_seconds{pool,worker}  time since each worker's last heartbeat
//	ortbus_worker_restarts_total{pool,worker}         restarts of supervised workers
//	ortbus_device_budget_bytes{device}                capacity x safe fraction of a device
//	ortbus_device_admitted_bytes{device}              model peaks admitted on a device
//	ortbus_device_leased_bytes{device}                memory held by leases of processes outside ortbus
//	ortbus_device_foreign_bytes{device}               memory other processes outside ortbus use, measured, past the leases
//	ortbus_panics_total                               panics recovered in this gateway (each answered internal)
//	ortbus_bad_messages_total{kind}                   bus messages dropped as malformed or forged (heartbeat, claim, journal, request, reply_subject)
//	ortbus_publish_errors_total{what}                 replies and messages that could not be sent (reply, cancel, journal)
//	ortbus_jobs_active                                jobs with items not yet settled (JetStream)
//	ortbus_job_items_pending                          items not yet delivered to any gateway: the consumer's lag
//	ortbus_job_items_ack_pending                      items delivered, not yet settled (all gateways)
//	ortbus_job_items_redelivered                      of those, items delivered more than once
//	ortbus_job_items_held                             items this gateway holds
//	ortbus_job_items_acked_total                      items this gateway settled
//
// and the devices' free memory and compute gates (devicemetrics.go), the result cache's
// figures (cache.go).
//
// Names from the wire are data, never structure: every label value is a configured name
// (pool, class, model), an op, a stable code, or a fixed word; anything else is counted
// as "other" (labelOf). Worker ids come only from the tracker, which keeps only
// heartbeats whose ids are valid tokens of bounded length, a bounded number per pool.
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	queueWait *prometheus.HistogramVec
	inference *prometheus.HistogramVec
	retries   prometheus.Counter
	badMsgs   *prometheus.CounterVec
	pubErrs   *prometheus.CounterVec
	known     map[string]bool // every configured pool, class and model, op and code
	// window is the classes' recent latency, read from latency and requests
	// (classstats.go); sampling while the gateway runs.
	window *classWindow
	// conf is the gateway's config in force (Gateway.conf): which models a pool loads,
	// for the model label of a request that named none (servedModel).
	conf func() *config.Config
	log  *slog.Logger
}

// labelOther stands for any label value that is not a configured name.
const labelOther = "other"

// labelOf returns v when it is a configured name (or empty), else labelOther.
func (m *metrics) labelOf(v string) string {
	if v == "" || m.known[v] {
		return v
	}
	return labelOther
}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// newMetrics is the metrics of config c (its names are the known label values); conf is
// the config in force (servedModel).
func newMetrics(c *config.Config, conf func() *config.Config, log *slog.Logger) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ortbus_requests_total",
			Help: "Terminal replies by op, class, pool, model and outcome code (ok for a result)."}, []string{"op", "class", "pool", "model", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ortbus_request_seconds",
			Help: "Time from acceptance by the gateway to the answer, of results.", Buckets: latencyBuckets}, []string{"op", "class"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ortbus_queue_wait_seconds",
			Help: "Time from acceptance by the gateway to the start of inference.", Buckets: latencyBuckets}, []string{"class", "pool"}),
		inference: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ortbus_inference_seconds",
			Help: "Inference time reported by the worker.", Buckets: latencyBuckets}, []string{"class", "pool", "model"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "ortbus_retries_total",
			Help: "Requests retried on another worker after their worker died."}),
		badMsgs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ortbus_bad_messages_total",
			Help: "Bus messages dropped as malformed or forged, by kind."}, []string{"kind"}),
		pubErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ortbus_publish_errors_total",
			Help: "Replies and messages that could not be sent, by what they were."}, []string{"what"}),
		known: map[string]bool{"ok": true},
		conf:  conf,
		log:   log,
	}
	panics := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ortbus_panics_total",
		Help: "Panics recovered in the gateway (each answered internal where a reply was due)."}, func() float64 { return float64(guard.Panics()) })
	for _, set := range [][]string{c.PoolNames(), c.ClassNames(), subjects.Ops} {
		for _, v := range set {
			m.known[v] = true
		}
	}
	for name := range c.Models {
		m.known[name] = true
	}
	for _, c := range codec.Codes {
		m.known[string(c)] = true
	}
	m.reg.MustRegister(m.requests, m.latency, m.queueWait, m.inference, m.retries, m.badMsgs, m.pubErrs, panics)
	m.window = newClassWindow(m)
	return m
}

// bad counts a dropped message of a kind (a fixed word).
func (m *metrics) bad(kind string) { m.badMsgs.WithLabelValues(kind).Inc() }

// publishFailed counts and logs a message the gateway could not send.
func (m *metrics) publishFailed(what string, err error) {
	m.pubErrs.WithLabelValues(what).Inc()
	m.log.Warn("publish failed", "what", what, "err", err)
}

// observe counts a terminal reply.
func (m *metrics) observe(p *pending, pool, outcome string) {
	model := m.servedModel(p, pool, p.req.Model)
	m.requests.WithLabelValues(m.labelOf(p.op), m.labelOf(p.class), m.labelOf(pool), m.labelOf(model), m.labelOf(outcome)).Inc()
	if outcome == "ok" {
		m.latency.WithLabelValues(m.labelOf(p.op), m.labelOf(p.class)).Observe(time.Since(p.accepted).Seconds())
	}
}

// timing records the worker's timing of a result of model.
func (m *metrics) timing(p *pending, pool string, t codec.Timing, model string) {
	model = m.servedModel(p, pool, model)
	m.queueWait.WithLabelValues(m.labelOf(p.class), m.labelOf(pool)).Observe(float64(t.QueueUS) / 1e6)
	m.inference.WithLabelValues(m.labelOf(p.class), m.labelOf(pool), m.labelOf(model)).Observe(float64(t.InferUS) / 1e6)
}

// servedModel is the model label of p answered by pool: model when known — the one the
// request named or its class's default for the op, or the worker's reply's Served.Model —
// else the model pool's workers pick for a request that names none (worker.modelSet.acquire:
// the pool's first model, in its order, whose kind serves the op), so that a detect, a
// segment or a batch tag without a model is not counted under an empty label. A request
// answered before it reached a pool (pool "") names only its own model, if any. Where the
// pool's first such model failed on its worker and another served, the label is still
// the first: the workers' direct answers (reply_direct) carry no model to the gateway.
func (m *metrics) servedModel(p *pending, pool, model string) string {
	if model != "" || pool == "" || m.conf == nil {
		return model
	}
	c := m.conf()
	for _, name := range c.Pool(pool).Models {
		if mc := c.Models[name]; mc != nil {
			if k, ok := config.KindOf(mc.Kind); ok && k.Serves(p.op) {
				return name
			}
		}
	}
	return ""
}

// jobStatsBound bounds the JetStream reads of a scrape.
const jobStatsBound = 2 * time.Second
