// Command ortbus is the user CLI of ortbus:
//
//	ortbus req [-s URL] [-inbox-prefix P] [-timeout 30s] [-trace | -traceparent TP] OP JSON
//	                                                               one request to ortbus.v1.OP, as JSON
//	ortbus status [-s URL] [-inbox-prefix P] [-json]               pools, workers, devices, class queues
//	ortbus doctor -config FILE [-json] [-timeout 20s]              runtime discovery and EP checks, per pool
//	ortbus models gen DIR [-heavy N]                               write the generated test/demo models
//	ortbus models gen-llm DIR [-size tiny|bench]                   write the generated GGUF LLM (genllm.go)
//	ortbus demo [-config deploy/local.toml] [-gateway PATH] [-stay] run the system end to end, print a report (and its page's address)
//	ortbus bench NAME [-out FILE.json] [flags]                     overhead, throughput, collision, failure (bench.go)
//	ortbus job submit|status|watch|wait|results|cancel|list ...    durable batch jobs, JSON lines (job.go)
//	ortbus help                                                    usage
//
// -s defaults to $NATS_URL, else nats://127.0.0.1:4222; -inbox-prefix to
// $ORTBUS_INBOX_PREFIX. doctor runs itself as `ortbus doctor-probe -config FILE -pool P`,
// one child process per pool. The contract these commands speak is docs/PROTOCOL.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/cli"
	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/demo"
	"github.com/ortbus/ortbus/doctor"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry"
)

func main() { os.Exit(run(os.Args[1:])) }

const usage = `usage:
  ortbus doctor -config FILE [-json]    check each pool's runtime library and execution providers
  ortbus models gen DIR [-heavy N]      write the generated models (N compute layers in tagger-heavy)
  ortbus models gen-llm DIR [-size tiny|bench]
                                        write the generated llama-architecture GGUF model (LLM tenant's; prints its path)
  ortbus demo [-config FILE] [-stay]    run the system end to end and print a report (default deploy/local.toml)
                                        and the page's address; -stay keeps the gateway and page up until Ctrl-C
  ortbus bench NAME [-out FILE.json]    overhead|throughput|collision|capacity|failure|jobs|incremental|lease (docs/BENCHMARKS.md)
  ortbus status [-s URL] [-json]        pools, workers, devices and class queues, as tables
  ortbus pause [-s URL] -class batch [-device D] -for 10m   pause a class on demand (it ends on its own); resume -class C ends it
  ortbus tune -config FILE [-input NAME=FILE.npy | -image FILE] [-latency D] [-write] POOL
                                        measure POOL's layouts (workers, threads, spin, max_batch) here; pick one
  ortbus reload [-s URL]                re-read the answering gateway's config file and apply it (pools, models) without a restart
  ortbus model load|unload|reload [-s URL] [-pool P] MODEL
                                        change one model at run time (load into pool P; unload, reload: every pool or P)
  ortbus req [-s URL] OP JSON           one request to ortbus.v1.OP (e.g. req tag '{"path":"/srv/a.png"}')
                                        -trace: in a new trace (its id on stderr); -traceparent TP: in the trace of TP
  ortbus lease [-s URL] --device D --bytes N [--class C] [--wait D] [--gate] [--on-pressure CMD2 [--on-relief CMD3]] -- CMD...
                                        hold device memory for CMD (e.g. an LLM server); --gate: pause it while urgent work runs
  ortbus job submit [-s URL] [--op tag] [--class batch] [--model M] [--pool P] [--job ID] [--recursive] [--incremental] [--anytime] PATH|DIR...
                                        submit a job: each file, each image (by content) of each directory is an item;
                                        prints {"job","total","skipped"}: every file left out, with its reason
                                        --anytime: run outside the quiet hours of [jobs] windows too
  ortbus job status|cancel|pause|resume [-s URL] ID
                                        a job's status, as JSON (after cancelling, pausing or resuming it)
  ortbus job watch [-s URL] ID          follow a job to its end: a progress bar on a terminal, else a JSON line per change;
                                        exits as job wait does
  ortbus job wait [-s URL] ID           wait for a job to finish, through gateway restarts; print its status;
                                        exit 0 every item done, 3 done with items failed, 1 cancelled, failed or an error
  ortbus job results [-s URL] ID        a JSON line per item: {"path","result"} or {"path","error"}
  ortbus job list [-s URL]              the jobs kept, newest first, as JSON
  ortbus cache stats|purge [-s URL] [--model M]   the result cache's figures; remove its entries (of model M)
                                        (status, req, job: -inbox-prefix P for a server with per-user inboxes)
`

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "doctor":
		return doctorCmd(args[1:])
	case "doctor-probe": // internal: one pool, in its own process
		return doctor.ProbeMain(args[1:])
	case "demo":
		return demoCmd(args[1:])
	case "bench":
		return benchCmd(args[1:])
	case "status":
		return statusCmd(args[1:])
	case "pause", "resume":
		return pauseCmd(args[0], args[1:])
	case "tune":
		return tuneCmd(args[1:])
	case "reload":
		return reloadCmd(args[1:])
	case "model":
		return modelCmd(args[1:])
	case "req":
		return reqCmd(args[1:])
	case "lease":
		return leaseCmd(args[1:])
	case "cache":
		return cacheCmd(args[1:])
	case "job":
		return jobCmd(args[1:])
	case "models":
		switch {
		case len(args) >= 2 && args[1] == "gen":
			return genCmd(args[2:])
		case len(args) >= 2 && args[1] == "gen-llm":
			return genLLMCmd(args[2:])
		}
		fmt.Fprint(os.Stderr, usage)
		return 2
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "ortbus: unknown command %q\n%s", args[0], usage)
	return 2
}

func doctorCmd(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "ortbus config file")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 20*time.Second, "per-pool probe timeout")
	withModels := fs.Bool("models", false, "also load each pool's models, warm them up once, and report where their nodes run (nodes_by_ep)")
	if fs.Parse(args) != nil || *cfgPath == "" {
		fmt.Fprintln(os.Stderr, "usage: ortbus doctor -config FILE [-json] [-models] [-timeout 20s]")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	childArgs := []string{"doctor-probe", "-config", *cfgPath}
	if *withModels {
		childArgs = append(childArgs, "-models")
	}
	reports := doctor.Run(cfg, self, childArgs, *timeout)
	img := doctor.ProbeImages(cfg)
	if *asJSON {
		// The pools' array, as before (libvips's report is in the text listing; a
		// missing libvips still makes the exit code 1).
		b, _ := json.MarshalIndent(reports, "", "  ")
		fmt.Println(string(b))
	} else {
		doctor.Print(os.Stdout, reports)
		doctor.PrintImages(os.Stdout, img)
	}
	if !img.OK() {
		return 1
	}
	for _, r := range reports {
		if !r.OK() {
			return 1
		}
	}
	return 0
}

func genCmd(args []string) int {
	fs := flag.NewFlagSet("models gen", flag.ContinueOnError)
	heavy := fs.Int("heavy", 8, "compute layers of tagger-heavy (about 4 ms each on one core)")
	var dir string
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		dir, args = args[0], args[1:]
	}
	if fs.Parse(args) != nil || (dir == "" && fs.NArg() != 1) {
		fmt.Fprintln(os.Stderr, "usage: ortbus models gen DIR [-heavy N]")
		return 2
	}
	if dir == "" {
		dir = fs.Arg(0)
	}
	if err := onnxgen.Generate(dir, onnxgen.Options{TaggerComputeLayers: *heavy}); err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 1
	}
	return 0
}

func demoCmd(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfgPath := fs.String("config", "deploy/local.toml", "ortbus config file")
	gatewayBin := fs.String("gateway", "", "gateway binary (default: next to this one)")
	stay := fs.Bool("stay", false, "keep the gateway and its page up after the report, until interrupted")
	if fs.Parse(args) != nil {
		return 2
	}
	if *gatewayBin == "" {
		self, _ := os.Executable()
		*gatewayBin = filepath.Join(filepath.Dir(self), "gateway")
	}
	t0 := time.Now()
	o := demo.Options{Config: *cfgPath, GatewayBin: *gatewayBin, Out: os.Stdout}
	if *stay {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		o.Stay = ctx.Done()
	}
	if err := demo.Run(o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	fmt.Printf("\ndemo finished in %s\n", time.Since(t0).Round(time.Millisecond))
	return 0
}

func natsURL(fs *flag.FlagSet) *string {
	def := os.Getenv("NATS_URL")
	if def == "" {
		def = "nats://127.0.0.1:4222"
	}
	return fs.String("s", def, "NATS server URL: $NATS_URL when set, else nats://127.0.0.1:4222")
}

// inboxPrefix is the -inbox-prefix flag: the prefix of the reply subjects, for a server that
// lets each user subscribe only to its own (deploy/cluster: _INBOX_client, _INBOX_ops).
func inboxPrefix(fs *flag.FlagSet) *string {
	return fs.String("inbox-prefix", os.Getenv("ORTBUS_INBOX_PREFIX"), "prefix of reply subjects, e.g. _INBOX_client (default $ORTBUS_INBOX_PREFIX, else _INBOX)")
}

// connOpts are the CLI's connection options, with the inbox prefix when one is given.
func connOpts(prefix string) []nats.Option {
	opts := []nats.Option{nats.Timeout(2 * time.Second), nats.MaxReconnects(0)}
	if prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	return opts
}

func statusCmd(args []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if fs.Parse(args) != nil {
		return 2
	}
	c, err := client.Connect(*url, connOpts(*prefix)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus status:", err)
		return 1
	}
	if *asJSON {
		b, _ := json.MarshalIndent(st, "", "  ")
		fmt.Println(string(b))
		return 0
	}
	cli.PrintStatus(os.Stdout, st)
	return 0
}

func pauseCmd(verb string, args []string) int {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	class := fs.String("class", "batch", "the class")
	device := fs.String("device", "", "one device (default every device)")
	dur := fs.Duration("for", 0, "how long (pause: required, 1s to 1h)")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "usage: ortbus %s [-s URL] -class C [-device D]%s\n", verb, map[bool]string{true: " -for D", false: ""}[verb == "pause"])
		return 2
	}
	req := &codec.PauseRequest{Action: verb, Class: *class, Device: *device, ForMS: dur.Milliseconds()}
	return call(*url, *prefix, 10*time.Second, "ortbus "+verb, false, func(ctx context.Context, c *client.Client) (any, error) { return c.Pause(ctx, req) })
}

func reloadCmd(args []string) int {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the new workers")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: ortbus reload [-s URL] [-inbox-prefix P] [-timeout D]")
		return 2
	}
	return call(*url, *prefix, *timeout, "ortbus reload", true, func(ctx context.Context, c *client.Client) (any, error) { return c.Reload(ctx) })
}

func modelCmd(args []string) int {
	fs := flag.NewFlagSet("model", flag.ContinueOnError)
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	pool := fs.String("pool", "", "the pool (load: required unless the gateway has one local pool)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the new workers")
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: ortbus model load|unload|reload [-s URL] [-pool P] MODEL")
		return 2
	}
	action := args[0]
	if parseInterspersed(fs, args[1:]) != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: ortbus model load|unload|reload [-s URL] [-pool P] MODEL")
		return 2
	}
	mc := &codec.ModelControl{Action: action, Model: fs.Arg(0), Pool: *pool}
	return call(*url, *prefix, *timeout, "ortbus model", true, func(ctx context.Context, c *client.Client) (any, error) { return c.Model(ctx, mc) })
}

// call connects, runs do within timeout and prints its reply as JSON (indented), or the
// error prefixed with what; the exit status is 1 on an error.
func call(url, prefix string, timeout time.Duration, what string, indent bool, do func(context.Context, *client.Client) (any, error)) int {
	c, err := client.Connect(url, connOpts(prefix)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rep, err := do(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, what+":", err)
		return 1
	}
	b, _ := json.Marshal(rep)
	if indent {
		b, _ = json.MarshalIndent(rep, "", "  ")
	}
	fmt.Println(string(b))
	return 0
}

// knownOps are the ops of the client API (subjects), which `ortbus req` takes.
func knownOps() []string {
	return slices.Concat(subjects.Ops, subjects.JobOps, subjects.CacheOps)
}

// parseInterspersed parses args with fs, taking flags after positional arguments too
// (`ortbus req tag '{…}' -timeout 5s`, `ortbus job wait ID -interval 1s`), where the flag
// package alone would stop at the first positional and read the flags after it as more
// positionals. "--" ends the flags: what follows it is positional, whatever it looks like.
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

func reqCmd(args []string) int {
	fs := flag.NewFlagSet("req", flag.ContinueOnError)
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the reply")
	traced := fs.Bool("trace", false, "start a trace: send a new traceparent, print its trace id on stderr")
	traceparent := fs.String("traceparent", "", "send this W3C traceparent (00-TRACE-SPAN-FLAGS); its trace id is printed on stderr")
	if parseInterspersed(fs, args) != nil || fs.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: ortbus req [-s URL] [-inbox-prefix P] [-trace | -traceparent TP] OP JSON")
		return 2
	}
	// A typo'd op would reach no service (nats: no responders): name the ops instead.
	if ops := knownOps(); !slices.Contains(ops, fs.Arg(0)) {
		fmt.Fprintf(os.Stderr, "ortbus req: unknown op %q; the ops: %s\n", fs.Arg(0), strings.Join(ops, ", "))
		return 2
	}
	nc, err := nats.Connect(*url, connOpts(*prefix)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 1
	}
	defer nc.Close()
	subj, err := subjects.API(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 2
	}
	msg := nats.NewMsg(subj)
	msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	msg.Data = []byte(fs.Arg(1))
	if tp, line := reqTrace(*traced, *traceparent); tp != "" {
		msg.Header.Set(telemetry.HeaderTraceparent, tp)
		fmt.Fprintln(os.Stderr, line)
	}
	reply, err := nc.RequestMsg(msg, *timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus req:", err)
		return 1
	}
	fmt.Println(string(reply.Data))
	if reply.Header.Get(codec.HeaderErrorCode) != "" {
		return 1
	}
	return 0
}

// reqTrace is the traceparent `ortbus req` sends and the line it prints on stderr: the
// one given (-traceparent), else a new one (-trace), else none. A malformed one is sent
// as given (the gateway ignores it and starts a new trace), and the line says so.
func reqTrace(traced bool, given string) (traceparent, line string) {
	switch {
	case given != "":
		if id := telemetry.TraceID(given); id != "" {
			return given, "trace " + id
		}
		return given, "trace: the traceparent is malformed; the gateway starts a new trace"
	case traced:
		tp, id := telemetry.NewTraceparent()
		return tp, "trace " + id
	}
	return "", ""
}
