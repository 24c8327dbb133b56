package gateway

import (
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/prometheus/client_golang/prometheus"
)

// deviceCollector reports, at scrape time, what a device's panel needs beyond the
// budget figures of stateCollector: the memory free for admission, and the compute gate
// of each device that has one (gate.go; only while gated leases are held there).
//
//	ortbus_device_free_bytes{device}               budget - admitted - leased - foreign: what admission may still give
//	ortbus_gate_paused{device,class}               1 while the gate holds its gated tenants paused, else 0
//	ortbus_gate_paused_share_1m{device,class}      the share of the last minute it held them paused
//	ortbus_gate_tenants{device,class}              gated leases that follow the gate
//
// class is the device's gating class (the urgent work that pauses the tenants).
type deviceCollector struct {
	conf   func() *config.Config
	budget *memoryBudget
	gates  *gates
}

var (
	descFree        = prometheus.NewDesc("ortbus_device_free_bytes", "Memory of a device's budget that admission may still give: budget - admitted - leased - foreign.", []string{"device"}, nil)
	descGatePaused  = prometheus.NewDesc("ortbus_gate_paused", "1 while a device's compute gate holds its gated tenants paused, else 0.", []string{"device", "class"}, nil)
	descGateShare   = prometheus.NewDesc("ortbus_gate_paused_share_1m", "Share of the last minute a device's compute gate held its gated tenants paused.", []string{"device", "class"}, nil)
	descGateTenants = prometheus.NewDesc("ortbus_gate_tenants", "Gated leases that follow a device's compute gate.", []string{"device", "class"}, nil)
)

func (c deviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFree, descGatePaused, descGateShare, descGateTenants} {
		ch <- d
	}
}

func (c deviceCollector) Collect(ch chan<- prometheus.Metric) {
	g := c
	for _, d := range g.budget.deviceStatus(g.conf()) {
		ch <- prometheus.MustNewConstMetric(descFree, prometheus.GaugeValue, float64(d.FreeBytes), d.Device)
	}
	if g.gates == nil {
		return
	}
	for _, gs := range g.gates.list(time.Now()) {
		paused := 0.0
		if gs.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descGatePaused, prometheus.GaugeValue, paused, gs.Device, gs.Class)
		ch <- prometheus.MustNewConstMetric(descGateShare, prometheus.GaugeValue, gs.PausedShare1m, gs.Device, gs.Class)
		ch <- prometheus.MustNewConstMetric(descGateTenants, prometheus.GaugeValue, float64(gs.Tenants), gs.Device, gs.Class)
	}
}
