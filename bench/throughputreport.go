package bench

// The throughput bench's printed report: the table of rates and ratios, and its targets'
// verdicts (the webgpu ones in printWebGPUTargets).

import (
	"fmt"
	"io"
	"time"
)

// print prints the table and the targets' verdicts, and notes the targets missed.
func (res *ThroughputResults) print(out io.Writer, rep *Report, tms []tpModel, phase time.Duration) {
	node, wg := res.Setup.Node, res.Setup.WebGPU
	paths := "in-process, system, batched"
	if node.Skipped == "" && wg == nil {
		paths += ", node, node no-spin"
	} else if node.Skipped == "" {
		paths += ", node"
	}
	rounds := res.Setup.Rounds
	if rounds == 0 {
		rounds = throughputRounds
	}
	layout := fmt.Sprintf("%d worker(s) per system pool", res.Setup.Workers)
	if res.Setup.Threads > 0 {
		layout += fmt.Sprintf(" × %d thread(s)", res.Setup.Threads)
	} else {
		layout += " × the model's threads"
	}
	fmt.Fprintf(out, "throughput: batch class, %s (ORT %s), %d in flight; per model %d rounds of (%s), %v measured per path\n",
		layout, RuntimeVersion, res.Setup.InFlight, rounds, paths, phase)
	if wg != nil {
		fmt.Fprintf(out, "ep: %s on every path (system pools on device %s, strict; in process; onnxruntime-node); each path's first run (shader compilation) paid before its warm-up\n", res.Setup.EP, wg.Device)
		wg.print(out, res)
	}
	if node.Skipped == "" && wg != nil {
		fmt.Fprintf(out, "node: onnxruntime-node %s in-process under %s (bench/node/throughput.mjs), executionProviders ['%s'], same model file, input tensor and intra-op threads, inter-op 1, sequential; spinning at its default (no no-spin path on %s)\n",
			node.OnnxruntimeNode, node.Runner, res.Setup.EP, res.Setup.EP)
	} else if node.Skipped == "" {
		fmt.Fprintf(out, "node: onnxruntime-node %s in-process under %s (bench/node/throughput.mjs), same model file, input tensor and intra-op threads, inter-op 1, sequential; node: spinning at its default, node no-spin: off\n",
			node.OnnxruntimeNode, node.Runner)
	} else {
		fmt.Fprintf(out, "node: SKIPPED, no onnxruntime-node figures in this run: %s\n", node.Skipped)
	}
	var rows, nodeRows []string
	for _, m := range tms {
		r := res.Ratios[m.name]
		label := m.name
		if wg != nil && wg.Smoke != "" {
			label += " [" + wg.Smoke + "]"
		}
		row := fmt.Sprintf("%s\t%d\t%.2f\t%.2f\t%.2f\t%.3f\t%.3f\t%.2f\t", label, max(m.threads, 1), res.InProcess.ByModel[m.name], res.System.ByModel[m.name],
			res.SystemBatched.ByModel[m.name], r.SystemOverInProcess, r.SystemBatchedOverInProcess, res.Models[m.name].MeanBatch)
		if node.Skipped == "" {
			row += fmt.Sprintf("%.2f\t%.3f\t%.3f\t%.3f\t", res.Node.ByModel[m.name], r.InProcessOverNode, r.SystemOverNode, r.SystemBatchedOverNode)
			nodeRows = append(nodeRows, fmt.Sprintf("%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t", m.name, res.NodeNoSpin.ByModel[m.name],
				r.InProcessOverNodeNoSpin, r.SystemOverNodeNoSpin, r.SystemBatchedOverNodeNoSpin,
				res.Models[m.name].NodeCPUPerItemMS["node"], res.Models[m.name].NodeCPUPerItemMS["node_nospin"]))
		}
		rows = append(rows, row)
	}
	head := "model\tthreads\tin-process/s\tsystem/s\tbatched/s\tsystem/in-proc\tbatched/in-proc\tmean batch\t"
	if node.Skipped == "" {
		head += "node/s\tin-proc/node\tsystem/node\tbatched/node\t"
	}
	printTable(out, head, rows...)
	if wg != nil {
		res.printWebGPUTargets(out, rep, tms)
		return
	}
	if node.Skipped == "" {
		printTable(out, "model\tnode no-spin/s\tin-proc/no-spin\tsystem/no-spin\tbatched/no-spin\tnode cpu ms/item\tno-spin cpu ms/item\t", nodeRows...)
	}
	for _, m := range tms {
		r := res.Ratios[m.name]
		fmt.Fprintf(out, "%s: system >= 0.9x in-process: %s; batched >= 1.0x in-process: %s", m.name,
			verdict(r.SystemOverInProcess >= 0.9), verdict(r.SystemBatchedOverInProcess >= 1.0))
		rep.target(r.SystemOverInProcess >= 0.9, "%s through the system is %.3fx in-process (target >= 0.9x)", m.name, r.SystemOverInProcess)
		rep.target(r.SystemBatchedOverInProcess >= 1.0, "%s through the system with max_batch %d is %.3fx in-process (target >= 1.0x)", m.name, ThroughputMaxBatch, r.SystemBatchedOverInProcess)
		if node.Skipped == "" {
			// Issue 12 item 3: ortbus at least as fast as onnxruntime-node on its defaults.
			best := max(r.SystemOverNode, r.SystemBatchedOverNode)
			fmt.Fprintf(out, "; ortbus (best of system, batched) >= 1.0x node: %s", verdict(best >= 1.0))
			rep.target(best >= 1.0, "%s through the system (best of plain and batched) is %.3fx onnxruntime-node on its defaults (target >= 1.0x)", m.name, best)
		}
		fmt.Fprintln(out)
	}
}

// printWebGPUTargets prints the verdicts of issue 31's targets on a webgpu run — the
// system (best of plain and batched) at least as fast as the in-process loop and as
// onnxruntime-node, all on webgpu — and notes those missed; a smoke run judges none.
func (res *ThroughputResults) printWebGPUTargets(out io.Writer, rep *Report, tms []tpModel) {
	wg := res.Setup.WebGPU
	if wg.Smoke != "" {
		fmt.Fprintf(out, "targets not judged: %s\n", wg.Smoke)
		return
	}
	for _, m := range tms {
		r := res.Ratios[m.name]
		best := max(r.SystemOverInProcess, r.SystemBatchedOverInProcess)
		fmt.Fprintf(out, "%s: system (best of plain, batched) >= 1.0x in-process webgpu: %s", m.name, verdict(best >= 1.0))
		rep.target(best >= 1.0, "%s through the system on webgpu (best of plain and batched) is %.3fx the in-process webgpu loop (target >= 1.0x)", m.name, best)
		if res.Setup.Node.Skipped == "" {
			bestNode := max(r.SystemOverNode, r.SystemBatchedOverNode)
			fmt.Fprintf(out, "; >= 1.0x onnxruntime-node webgpu: %s", verdict(bestNode >= 1.0))
			rep.target(bestNode >= 1.0, "%s through the system on webgpu (best of plain and batched) is %.3fx onnxruntime-node's webgpu (target >= 1.0x)", m.name, bestNode)
		}
		fmt.Fprintln(out)
	}
}
