// Package cli holds what the ortbus command prints for people: the status table, a job's
// progress line.
package cli

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// PrintStatus writes a status reply as tables: pools, workers, models, devices, classes.
func PrintStatus(w io.Writer, st *codec.StatusReply) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "gateway %s   allowed roots %s   spool %s\n\n", st.Gateway, strings.Join(st.AllowedRoots, ","), st.SpoolDir)
	fmt.Fprintln(tw, "POOL\tEP\tDEVICE\tLOCAL\tCLASSES\tLIVE/WORKERS\tSTATE")
	for _, p := range st.Pools {
		state := "ok"
		failed := failedModels(st.Workers, p.Name)
		switch {
		case p.Error != nil:
			state = string(p.Error.Code) + ": " + p.Error.Message
		case p.CrashLooping:
			state = "crash-looping"
		case p.Live == 0:
			state = "no live workers"
		case len(failed) > 0:
			// A model is the unit of failure: the pool serves its other models.
			state = "ok; failed models: " + strings.Join(failed, ",")
		}
		state += adapterFlag(st.Workers, p.Name)
		if len(p.Loading) > 0 {
			state += "; loading: " + oneLine(strings.Join(p.Loading, ","), 200)
		}
		if len(p.Unloaded) > 0 {
			state += "; unloaded: " + oneLine(strings.Join(p.Unloaded, ","), 200)
		}
		if len(p.Skipped) > 0 {
			state += "; skipped (a worker died loading them): " + oneLine(strings.Join(slices.Sorted(maps.Keys(p.Skipped)), ","), 200)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%d/%d\t%s\n", p.Name, p.EP, p.Device, p.Local, strings.Join(p.Classes, ","), p.Live, p.Workers, state)
	}
	fmt.Fprintln(tw, "\nWORKER\tPOOL\tPID\tHOST\tSTATE\tORT\tEP\tDEVICE MEM\tSLOTS\tQUEUED\tRUNNING\tSERVED\tFAILED\tHB AGE\tRESTARTS\tLAST EXIT")
	for _, wk := range st.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", wk.Worker, wk.Pool, wk.PID, wk.Host, wk.State, wk.Runtime, wk.EP,
			deviceMem(wk.Heartbeat), wk.Slots, counts(wk.Queued), counts(wk.Running), wk.Served, wk.Failed, (time.Duration(wk.HeartbeatAgeMS) * time.Millisecond).String(), wk.Restarts, wk.LastExit)
	}
	printModels(tw, st.Workers)
	if len(st.Devices) > 0 {
		fmt.Fprintln(tw, "\nDEVICE\tCAPACITY\tSAFE\tBUDGET\tADMITTED\tLEASED\tFOREIGN\tFREE\tPOOLS")
		for _, d := range st.Devices {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Device, capacity(d), d.SafeFraction, mib(d.BudgetBytes), mib(d.AdmittedBytes), mib(d.LeasedBytes), mib(d.ForeignBytes), mib(d.FreeBytes), strings.Join(d.Pools, ","))
		}
		var leases []string
		for _, d := range st.Devices {
			for _, l := range d.Leases {
				leases = append(leases, fmt.Sprintf("%s\t%s\t%s\t%s\t%s", d.Device, l.Holder, l.Class, mib(l.Bytes), time.Until(time.UnixMilli(l.ExpiresUnixMS)).Round(time.Second)))
			}
		}
		if len(leases) > 0 {
			fmt.Fprintln(tw, "\nLEASE ON\tHOLDER\tCLASS\tBYTES\tEXPIRES IN")
			for _, l := range leases {
				fmt.Fprintln(tw, l)
			}
		}
	}
	if len(st.Gates) > 0 {
		fmt.Fprintln(tw, "\nGATE ON\tCLASS\tPAUSED\tPAUSED 1M\tTENANTS")
		for _, g := range st.Gates {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%.1f%%\t%d\n", g.Device, g.Class, g.Paused, 100*g.PausedShare1m, g.Tenants)
		}
	}
	if len(st.Pauses) > 0 {
		// The pauses in force (op pause): a paused class's queued requests wait and jobs
		// take no new items there, so an operator wondering why batch stands still sees why.
		fmt.Fprintln(tw, "\nPAUSED CLASS\tDEVICE\tOWNER\tUNTIL\tENDS IN")
		for _, p := range st.Pauses {
			until := time.UnixMilli(p.UntilUnixMS)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Class, or(p.Device, "every device"), or(oneLine(p.Owner, 80), "operator"), until.Format(time.TimeOnly), time.Until(until).Round(time.Second))
		}
	}
	fmt.Fprintln(tw, "\nCLASS\tPRIORITY\tQUEUED\tRUNNING\tBOUND\tCHAIN")
	for _, c := range st.Classes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", c.Name, c.Priority, c.Queued, c.Running, c.Bound, strings.Join(c.Chain, " -> "))
	}
	tw.Flush()
}

func counts(m map[string]int) string {
	var parts []string
	std := []string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}
	for _, k := range std {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", k[:1], m[k]))
		}
	}
	for k, v := range m {
		if v > 0 && !slices.Contains(std, k) {
			parts = append(parts, fmt.Sprintf("%s:%d", k, v))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// deviceMem is a worker's own memory on its device as its driver reports it ("cuda:0
// 195MiB"), or "-" where the device has no per-process reader (cpu).
func deviceMem(hb codec.Heartbeat) string {
	if hb.DeviceSource == "" {
		return "-"
	}
	return hb.Device + " " + mib(hb.DeviceBytes)
}

func mib(b int64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }

// printModels writes each worker's models: state, load time, peak memory, and why a
// failed model failed (or why a ready one's warm-up failed). Workers without models (a
// worker that failed to start) are left out.
func printModels(tw io.Writer, workers []codec.WorkerStatus) {
	header := false
	for _, wk := range workers {
		for _, m := range wk.Models {
			if !header {
				fmt.Fprintln(tw, "\nMODEL\tPOOL\tWORKER\tSTATE\tLOAD\tPEAK\tNODES\tREASON")
				header = true
			}
			reason := ""
			switch {
			case m.Error != nil:
				reason = string(m.Error.Code) + ": " + m.Error.Message
			case m.WarmupError != "":
				reason = "warm-up failed (serves all the same): " + m.WarmupError
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, wk.Pool, wk.Worker, modelState(m),
				(time.Duration(m.LoadMS) * time.Millisecond).String(), mib(m.PeakBytes), nodesByEP(m.NodesByEP), oneLine(reason, 160))
		}
	}
}

// nodesByEP is a model's node placement in one cell, "webgpu:12,cpu:1" (the model's
// EPs by name), "-" when not known.
func nodesByEP(n map[string]int) string {
	if len(n) == 0 {
		return "-"
	}
	var parts []string
	for _, ep := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s:%d", ep, n[ep]))
	}
	return strings.Join(parts, ",")
}

// modelState is a model's state as a heartbeat reports it; a worker older than the
// field says only whether it is loaded.
func modelState(m codec.ModelStatus) string {
	switch {
	case m.State != "":
		return m.State
	case m.Loaded:
		return codec.ModelReady
	}
	return "-"
}

// failedModels lists the models that failed on a worker of pool (each once, in order).
func failedModels(workers []codec.WorkerStatus, pool string) []string {
	var out []string
	for _, wk := range workers {
		if wk.Pool != pool {
			continue
		}
		for _, m := range wk.Models {
			if m.State == codec.ModelFailed && !slices.Contains(out, m.Name) {
				out = append(out, m.Name)
			}
		}
	}
	return out
}

// oneLine is s on one line (a tab or newline would break the table), cut to n runes.
func oneLine(s string, n int) string {
	// Text from a heartbeat is the sender's: no control character (a terminal escape)
	// reaches the operator's terminal.
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// or is a, else b.
func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
