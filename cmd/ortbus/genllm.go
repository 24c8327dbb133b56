package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/ortbus/ortbus/models/gguf"
)

// genLLMCmd is `ortbus models gen-llm DIR [-size tiny|bench]`: it writes the generated
// llama-architecture GGUF model (models/gguf) into DIR as llm-SIZE.gguf, leaving a
// correct one in place, and prints its path.
func genLLMCmd(args []string) int {
	fs := flag.NewFlagSet("models gen-llm", flag.ContinueOnError)
	size := fs.String("size", "tiny", "model size: "+strings.Join(gguf.SizeNames(), "|"))
	if parseInterspersed(fs, args) != nil || fs.NArg() != 1 {
		fmt.Fprintf(os.Stderr, "usage: ortbus models gen-llm DIR [-size %s]\n", strings.Join(gguf.SizeNames(), "|"))
		return 2
	}
	path, err := gguf.GenerateLlama(fs.Arg(0), *size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus:", err)
		return 1
	}
	fmt.Println(path)
	return 0
}
