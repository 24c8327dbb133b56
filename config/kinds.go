package config

import (
	"slices"

	"github.com/ortbus/ortbus/subjects"
)

// Model kinds.
const (
	KindTaggerPixAI = "tagger-pixai"
	KindTaggerWD14  = "tagger-wd14"
	KindTaggerOppai = "tagger-oppai"
	KindCCIP        = "ccip"
	KindDetect      = "detect"
	KindSegment     = "segment"
	KindRaw         = "raw"
)

// Kind is what ortbus knows of a model kind without loading a model: the ops it serves,
// which of them may be batched, and the files it reads from the model's folder.
type Kind struct {
	Name string
	// Ops are the client ops a model of the kind serves; the first is its default op.
	Ops []string
	// Batch are the ops whose items may share one runtime call (dynamic batching). A
	// model may still refuse: a tagger-oppai network whose batch dimension is fixed at 1.
	Batch []string
	// Files maps each file role to its default name in the model's folder (a model's
	// `files` table overrides any role, and may name a role without a default, such as
	// a tagger-wd14's thresholds); Required are the roles whose file must exist.
	Files    map[string]string
	Required []string
}

// Kinds is the one table of model kinds: the config accepts these, the gateway routes an op
// to the models whose kind serves it, and the worker's models package loads each kind by
// it (ops, batching, files).
var Kinds = []Kind{
	{Name: KindTaggerPixAI, Ops: []string{subjects.OpTag}, Batch: []string{subjects.OpTag},
		Files:    map[string]string{"model": "model.onnx", "tags": "selected_tags.csv", "thresholds": "thresholds.csv"},
		Required: []string{"model", "tags"}},
	{Name: KindTaggerWD14, Ops: []string{subjects.OpTag}, Batch: []string{subjects.OpTag},
		Files:    map[string]string{"model": "model.onnx", "tags": "selected_tags.csv"},
		Required: []string{"model", "tags"}},
	{Name: KindTaggerOppai, Ops: []string{subjects.OpTag}, Batch: []string{subjects.OpTag},
		Files:    map[string]string{"model": "model.onnx", "vocabulary": "vocabulary.json", "thresholds": "pr_thresholds.json"},
		Required: []string{"model", "vocabulary"}},
	// compare needs the metrics model; without it a ccip model answers compare unknown_op.
	{Name: KindCCIP, Ops: []string{subjects.OpEmbed, subjects.OpCompare}, Batch: []string{subjects.OpEmbed},
		Files:    map[string]string{"model": "model_feat.onnx", "metrics": "model_metrics.onnx", "metrics_json": "metrics.json"},
		Required: []string{"model"}},
	{Name: KindDetect, Ops: []string{subjects.OpDetect}, Batch: []string{subjects.OpDetect},
		Files: map[string]string{"model": "model.onnx"}, Required: []string{"model"}},
	{Name: KindSegment, Ops: []string{subjects.OpSegment},
		Files: map[string]string{"model": "model.onnx"}, Required: []string{"model"}},
	{Name: KindRaw, Ops: []string{subjects.OpInfer},
		Files: map[string]string{"model": "model.onnx"}, Required: []string{"model"}},
}

// KnownKinds are the names of Kinds, in order.
var KnownKinds = func() []string {
	var names []string
	for _, k := range Kinds {
		names = append(names, k.Name)
	}
	return names
}()

// KindOf returns the kind named name, and whether there is one.
func KindOf(name string) (Kind, bool) {
	i := slices.IndexFunc(Kinds, func(k Kind) bool { return k.Name == name })
	if i < 0 {
		return Kind{}, false
	}
	return Kinds[i], true
}

// Serves reports whether models of the kind serve op.
func (k Kind) Serves(op string) bool { return slices.Contains(k.Ops, op) }

// Batchable reports whether items of op may share one runtime call.
func (k Kind) Batchable(op string) bool { return slices.Contains(k.Batch, op) }
