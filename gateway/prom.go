package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func promHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// stateCollector reports gauges read from the gateway's state at scrape time.
type stateCollector struct {
	conf       func() *config.Config
	d          *dispatcher
	budget     *memoryBudget
	tracker    *health.Tracker
	supervisor *supervisor
	jobs       *jobService
}

var (
	descQueued   = prometheus.NewDesc("ortbus_queued", "Requests waiting in the gateway.", []string{"class"}, nil)
	descInflight = prometheus.NewDesc("ortbus_inflight", "Requests dispatched to a pool and not yet answered.", []string{"pool"}, nil)
	descHBAge    = prometheus.NewDesc("ortbus_worker_heartbeat_age_seconds", "Time since the worker's last heartbeat.", []string{"pool", "worker"}, nil)
	descRestarts = prometheus.NewDesc("ortbus_worker_restarts_total", "Restarts of a supervised worker.", []string{"pool", "worker"}, nil)
	descBudget   = prometheus.NewDesc("ortbus_device_budget_bytes", "Memory budget of a device: capacity x safe fraction.", []string{"device"}, nil)
	descAdmitted = prometheus.NewDesc("ortbus_device_admitted_bytes", "Model peak memory admitted on a device.", []string{"device"}, nil)
	descLeased   = prometheus.NewDesc("ortbus_device_leased_bytes", "Memory of a device held by leases of processes outside ortbus.", []string{"device"}, nil)
	descForeign  = prometheus.NewDesc("ortbus_device_foreign_bytes", "Memory of a device that processes outside ortbus are measured to use, past what leases cover.", []string{"device"}, nil)

	descJobsActive     = prometheus.NewDesc("ortbus_jobs_active", "Jobs with items not yet settled.", nil, nil)
	descJobPending     = prometheus.NewDesc("ortbus_job_items_pending", "Job items not yet delivered to any gateway (the consumer's lag).", nil, nil)
	descJobAckPending  = prometheus.NewDesc("ortbus_job_items_ack_pending", "Job items delivered and not yet settled, over all gateways.", nil, nil)
	descJobRedelivered = prometheus.NewDesc("ortbus_job_items_redelivered", "Job items delivered and not yet settled that were delivered more than once.", nil, nil)
	descJobHeld        = prometheus.NewDesc("ortbus_job_items_held", "Job items this gateway holds.", nil, nil)
	descJobAcked       = prometheus.NewDesc("ortbus_job_items_acked_total", "Job items this gateway settled.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descQueued
	ch <- descInflight
	ch <- descHBAge
	ch <- descRestarts
	ch <- descBudget
	ch <- descAdmitted
	ch <- descLeased
	ch <- descForeign
	for _, d := range []*prometheus.Desc{descJobsActive, descJobPending, descJobAckPending, descJobRedelivered, descJobHeld, descJobAcked} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	g := c
	cfg := g.conf()
	for _, class := range cfg.ClassNames() {
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(g.d.queues.Len(class)), class)
	}
	inflight := map[string]int{}
	g.d.inspect(func(lc *lifecycle) {
		for _, pool := range cfg.PoolNames() {
			inflight[pool] = lc.inFlight(pool)
		}
	})
	for _, pool := range cfg.PoolNames() {
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(inflight[pool]), pool)
	}
	for _, d := range g.budget.deviceStatus(cfg) {
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(d.BudgetBytes), d.Device)
		ch <- prometheus.MustNewConstMetric(descAdmitted, prometheus.GaugeValue, float64(d.AdmittedBytes), d.Device)
		ch <- prometheus.MustNewConstMetric(descLeased, prometheus.GaugeValue, float64(d.LeasedBytes), d.Device)
		ch <- prometheus.MustNewConstMetric(descForeign, prometheus.GaugeValue, float64(d.ForeignBytes), d.Device)
	}
	c.collectJobs(ch)
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

// collectJobs reports the job store's figures, when it is open and answers in time.
func (c *stateCollector) collectJobs(ch chan<- prometheus.Metric) {
	s, _ := c.jobs.get()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), jobStatsBound)
	defer cancel()
	st, err := s.Stats(ctx)
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(descJobHeld, float64(st.Held))
	ch <- prometheus.MustNewConstMetric(descJobAcked, prometheus.CounterValue, float64(st.Acked))
	if err != nil {
		return // JetStream's figures are left out rather than reported wrong
	}
	gauge(descJobsActive, float64(st.ActiveJobs))
	gauge(descJobPending, float64(st.Pending))
	gauge(descJobAckPending, float64(st.AckPending))
	gauge(descJobRedelivered, float64(st.Redelivered))
}
