package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/codec"
)

// metrics are the gateway's Prometheus series (served at GET /metrics). Names and labels:
//
//	ortbus_requests_total{op,class,pool,model,code}   terminal replies by outcome ("ok" or the error code)
//	ortbus_queue_wait_seconds{class,pool}             time from acceptance to the start of inference
//	ortbus_inference_seconds{class,pool,model}        inference time reported by the worker
//	ortbus_retries_total                              requests retried after their worker died
//	ortbus_queued{class}                              requests waiting in the gateway
//	ortbus_inflight{pool}                             requests dispatched and not yet answered
//	ortbus_worker_heartbeat_age_seconds{pool,worker}  time since each worker's last heartbeat
//	ortbus_worker_restarts_total{pool,worker}         restarts of supervised workers
//	ortbus_device_budget_bytes{device}                capacity x safe fraction of a device
//	ortbus_device_admitted_bytes{device}              model peaks admitted on a device
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	queueWait *prometheus.HistogramVec
	inference *prometheus.HistogramVec
	retries   prometheus.Counter
}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ortbus_requests_total",
			Help: "Terminal replies by op, class, pool, model and outcome code (ok for a result)."}, []string{"op", "class", "pool", "model", "code"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ortbus_queue_wait_seconds",
			Help: "Time from acceptance by the gateway to the start of inference.", Buckets: latencyBuckets}, []string{"class", "pool"}),
		inference: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ortbus_inference_seconds",
			Help: "Inference time reported by the worker.", Buckets: latencyBuckets}, []string{"class", "pool", "model"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "ortbus_retries_total",
			Help: "Requests retried on another worker after their worker died."}),
	}
	m.reg.MustRegister(m.requests, m.queueWait, m.inference, m.retries, &stateCollector{g: g})
	return m
}

// observe counts a terminal reply.
func (m *metrics) observe(p *pending, outcome string) {
	m.requests.WithLabelValues(p.op, p.class, p.pool, p.req.Model, outcome).Inc()
}

// timing records the worker's timing of a successful reply and returns it.
func (m *metrics) timing(p *pending, body []byte) (codec.Timing, bool) {
	var s codec.Served
	if codec.Unmarshal(body, &s) != nil {
		return codec.Timing{}, false
	}
	m.queueWait.WithLabelValues(p.class, p.pool).Observe(float64(s.Timing.QueueUS) / 1e6)
	m.inference.WithLabelValues(p.class, p.pool, s.Model).Observe(float64(s.Timing.InferUS) / 1e6)
	return s.Timing, true
}

// stateCollector reports gauges read from the gateway's state at scrape time.
type stateCollector struct{ g *Gateway }

var (
	descQueued   = prometheus.NewDesc("ortbus_queued", "Requests waiting in the gateway.", []string{"class"}, nil)
	descInflight = prometheus.NewDesc("ortbus_inflight", "Requests dispatched to a pool and not yet answered.", []string{"pool"}, nil)
	descHBAge    = prometheus.NewDesc("ortbus_worker_heartbeat_age_seconds", "Time since the worker's last heartbeat.", []string{"pool", "worker"}, nil)
	descRestarts = prometheus.NewDesc("ortbus_worker_restarts_total", "Restarts of a supervised worker.", []string{"pool", "worker"}, nil)
	descBudget   = prometheus.NewDesc("ortbus_device_budget_bytes", "Memory budget of a device: capacity x safe fraction.", []string{"device"}, nil)
	descAdmitted = prometheus.NewDesc("ortbus_device_admitted_bytes", "Model peak memory admitted on a device.", []string{"device"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descQueued
	ch <- descInflight
	ch <- descHBAge
	ch <- descRestarts
	ch <- descBudget
	ch <- descAdmitted
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.g
	for _, class := range g.cfg.ClassNames() {
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(g.queues.Len(class)), class)
	}
	g.mu.Lock()
	for _, pool := range g.cfg.PoolNames() {
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(g.busy[pool]), pool)
	}
	g.mu.Unlock()
	for _, d := range g.deviceStatus() {
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(d.BudgetBytes), d.Device)
		ch <- prometheus.MustNewConstMetric(descAdmitted, prometheus.GaugeValue, float64(d.AdmittedBytes), d.Device)
	}
	now := time.Now()
	for _, w := range g.tracker.Workers() {
		if w.Dead {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descHBAge, prometheus.GaugeValue, now.Sub(w.Seen).Seconds(), w.HB.Pool, w.HB.Worker)
		if ps, ok := g.supervisor.status(w.HB.Worker); ok {
			ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(ps.restarts), w.HB.Pool, w.HB.Worker)
		}
	}
}
