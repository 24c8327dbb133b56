// Command ortbus is the user CLI of ortbus:
//
//	ortbus doctor -config FILE [-json]      runtime discovery and EP checks, per pool
//	ortbus models gen DIR [-heavy N]        write the generated test/demo models
//
// See the README for the rest of the system.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/demo"
	"github.com/ortbus/ortbus/doctor"
	"github.com/ortbus/ortbus/models/onnxgen"
)

func main() { os.Exit(run(os.Args[1:])) }

const usage = `usage:
  ortbus doctor -config FILE [-json]    check each pool's runtime library and execution providers
  ortbus models gen DIR [-heavy N]      write the generated models (N compute layers in tagger-heavy)
  ortbus demo -config FILE              run the system end to end and print a report
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
		return probeCmd(args[1:])
	case "demo":
		return demoCmd(args[1:])
	case "models":
		if len(args) < 2 || args[1] != "gen" {
			fmt.Fprint(os.Stderr, usage)
			return 2
		}
		return genCmd(args[2:])
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
	if fs.Parse(args) != nil || *cfgPath == "" {
		fmt.Fprintln(os.Stderr, "usage: ortbus doctor -config FILE [-json]")
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
	reports := doctor.Run(cfg, self, []string{"doctor-probe", "-config", *cfgPath}, *timeout)
	if *asJSON {
		b, _ := json.MarshalIndent(reports, "", "  ")
		fmt.Println(string(b))
	} else {
		doctor.Print(os.Stdout, reports)
	}
	for _, r := range reports {
		if !r.OK() {
			return 1
		}
	}
	return 0
}

func probeCmd(args []string) int {
	fs := flag.NewFlagSet("doctor-probe", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "")
	pool := fs.String("pool", "", "")
	if fs.Parse(args) != nil {
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, _ := json.Marshal(doctor.Probe(cfg, *pool))
	fmt.Println(string(b))
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
	if fs.Parse(args) != nil {
		return 2
	}
	if *gatewayBin == "" {
		self, _ := os.Executable()
		*gatewayBin = filepath.Join(filepath.Dir(self), "gateway")
	}
	t0 := time.Now()
	if err := demo.Run(demo.Options{Config: *cfgPath, GatewayBin: *gatewayBin, Out: os.Stdout}); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	fmt.Printf("\ndemo finished in %s\n", time.Since(t0).Round(time.Millisecond))
	return 0
}
