// Package cli holds what the ortbus command prints for people: the status table, a job's
// progress line.
package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// PrintStatus writes a status reply as tables: pools, workers, devices, classes.
func PrintStatus(w io.Writer, st *codec.StatusReply) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "gateway %s   allowed roots %s   spool %s\n\n", st.Gateway, strings.Join(st.AllowedRoots, ","), st.SpoolDir)
	fmt.Fprintln(tw, "POOL\tEP\tDEVICE\tLOCAL\tCLASSES\tLIVE/WORKERS\tSTATE")
	for _, p := range st.Pools {
		state := "ok"
		switch {
		case p.Error != nil:
			state = string(p.Error.Code) + ": " + p.Error.Message
		case p.CrashLooping:
			state = "crash-looping"
		case p.Live == 0:
			state = "no live workers"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%d/%d\t%s\n", p.Name, p.EP, p.Device, p.Local, strings.Join(p.Classes, ","), p.Live, p.Workers, state)
	}
	fmt.Fprintln(tw, "\nWORKER\tPOOL\tPID\tHOST\tSTATE\tORT\tEP\tSLOTS\tQUEUED\tRUNNING\tSERVED\tFAILED\tHB AGE\tRESTARTS\tLAST EXIT")
	for _, wk := range st.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", wk.Worker, wk.Pool, wk.PID, wk.Host, wk.State, wk.Runtime, wk.EP,
			wk.Slots, counts(wk.Queued), counts(wk.Running), wk.Served, wk.Failed, (time.Duration(wk.HeartbeatAgeMS) * time.Millisecond).String(), wk.Restarts, wk.LastExit)
	}
	if len(st.Devices) > 0 {
		fmt.Fprintln(tw, "\nDEVICE\tCAPACITY\tSAFE\tBUDGET\tADMITTED\tLEASED\tFOREIGN\tFREE\tPOOLS")
		for _, d := range st.Devices {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Device, mib(d.CapacityBytes), d.SafeFraction, mib(d.BudgetBytes), mib(d.AdmittedBytes), mib(d.LeasedBytes), mib(d.ForeignBytes), mib(d.FreeBytes), strings.Join(d.Pools, ","))
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

func mib(b int64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }
