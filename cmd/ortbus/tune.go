package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ortbus/ortbus/bench"
)

const tuneUsage = `usage: ortbus tune -config FILE [flags] POOL
  measures POOL's layouts on this machine (workers × threads ≤ cores, spinning off and on,
  max_batch 1 and 8 where the model batches), prints the table and the winner
  -config FILE       the config file (required)
  -model M           the pool's model to run (default: its first)
  -input NAME=FILE   an infer model's input, a .npy file, or zeros:1x3x640x640 (once per input)
  -image FILE        another kind's request image (inside the config's allowed roots)
  -duration D        measured time per layout (default 3s)
  -latency D         the p95 bound a winner must meet (default: none)
  -ep webgpu         run every layout on ONNX Runtime's WebGPU EP (strict), sweeping workers 1..4
                     × max_batch at 1 thread, spin off; -write then also writes ep and device
  -device D          with -ep webgpu: the device, cuda:N, drm:N or cpu (default: the pool's when it
                     is webgpu, else the GPU found, else cpu: lavapipe)
  -write             put the winner in the config file's [pools.POOL] table
  -json FILE         write the results as JSON
  -repo DIR, -bin DIR, -v   as for ortbus bench
`

// inputsFlag collects -input NAME=FILE.
type inputsFlag map[string]string

func (f inputsFlag) String() string { return fmt.Sprint(map[string]string(f)) }
func (f inputsFlag) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want NAME=FILE.npy")
	}
	f[name] = path
	return nil
}

// tuneCmd runs ortbus tune.
func tuneCmd(args []string) int {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, tuneUsage) }
	var o bench.TuneOptions
	o.Inputs = inputsFlag{}
	fs.StringVar(&o.Config, "config", "", "")
	fs.StringVar(&o.Model, "model", "", "")
	fs.Var(inputsFlag(o.Inputs), "input", "")
	fs.StringVar(&o.Image, "image", "", "")
	fs.DurationVar(&o.Duration, "duration", 0, "")
	fs.DurationVar(&o.Latency, "latency", 0, "")
	fs.StringVar(&o.EP, "ep", "", "")
	fs.StringVar(&o.Device, "device", "", "")
	fs.BoolVar(&o.Write, "write", false, "")
	jsonOut := fs.String("json", "", "")
	fs.StringVar(&o.Repo, "repo", "", "")
	fs.StringVar(&o.BinDir, "bin", "", "")
	verbose := fs.Bool("v", false, "")
	// The pool may come before or after the flags.
	var pool string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pool, args = args[0], args[1:]
	}
	if fs.Parse(args) != nil {
		return 2
	}
	if pool == "" && fs.NArg() == 1 {
		pool = fs.Arg(0)
	}
	if pool == "" || o.Config == "" {
		fmt.Fprint(os.Stderr, tuneUsage)
		return 2
	}
	o.Pool = pool
	if *verbose {
		o.Logs = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := bench.Tune(ctx, o)
	if *jsonOut != "" && res != nil {
		b, _ := json.MarshalIndent(res, "", "  ")
		if werr := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "ortbus tune:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus tune:", err)
		return 1
	}
	return 0
}
