package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// dashboardPath is the Grafana dashboard of the repository (README.md, Metrics).
const dashboardPath = "../deploy/grafana/ortbus.json"

// seriesNeed is a series a dashboard query reads: its metric and the labels it matches
// on or groups by.
type seriesNeed struct {
	metric string
	labels []string
	query  string // where it comes from
}

// grafanaVars are Grafana's own variables in range selectors, replaced by a duration
// before the query is parsed.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// labelValuesQuery is a template variable's query: label_values(METRIC, LABEL).
var labelValuesQuery = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// dashboardNeeds parses every query of the dashboard at path (the panels' targets, the
// template variables') with the PromQL parser and returns the series they read.
func dashboardNeeds(t *testing.T, path string) []seriesNeed {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var needs []seriesNeed
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if json.Unmarshal(v.Query, &q) != nil {
			json.Unmarshal(v.Query, &q.Query)
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("template variable query %q is not label_values(METRIC, LABEL)", q.Query)
		}
		needs = append(needs, seriesNeed{metric: m[1], labels: []string{m[2]}, query: q.Query})
	}
	p := parser.NewParser(parser.Options{})
	var walk func([]dashPanel)
	walk = func(panels []dashPanel) {
		for _, pn := range panels {
			walk(pn.Panels)
			for _, tg := range pn.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q: a target without an expr", pn.Title)
					continue
				}
				expr, err := p.ParseExpr(grafanaVars.Replace(tg.Expr))
				if err != nil {
					t.Errorf("panel %q: %q: %v", pn.Title, tg.Expr, err)
					continue
				}
				needs = append(needs, selectorNeeds(expr, tg.Expr)...)
			}
		}
	}
	walk(dash.Panels)
	if len(needs) == 0 {
		t.Fatalf("%s has no queries", path)
	}
	return needs
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// selectorNeeds are the series of each vector selector in expr: its metric, the labels
// its matchers name, and those the aggregations above it group by.
func selectorNeeds(expr parser.Expr, query string) []seriesNeed {
	var out []seriesNeed
	parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		need := seriesNeed{metric: vs.Name, query: query}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				need.labels = append(need.labels, m.Name)
			}
		}
		for _, a := range path {
			if agg, ok := a.(*parser.AggregateExpr); ok && !agg.Without {
				need.labels = append(need.labels, agg.Grouping...)
			}
		}
		out = append(out, need)
		return nil
	})
	return out
}

// missingSeries is what of needs the scrape lacks: a metric with no sample, or whose
// samples have none of a label. A histogram's _bucket, _sum and _count are its family's
// (le the buckets' label).
func missingSeries(scrape string, needs []seriesNeed) ([]string, error) {
	tp := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := tp.TextToMetricFamilies(strings.NewReader(scrape))
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, n := range needs {
		name, suffix := n.metric, ""
		fam := fams[name]
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n.metric, s); fam == nil && ok && fams[base] != nil && fams[base].GetType() == dto.MetricType_HISTOGRAM {
				fam, suffix = fams[base], s
			}
		}
		if fam == nil || len(fam.Metric) == 0 {
			missing = append(missing, fmt.Sprintf("%s (in %s)", n.metric, n.query))
			continue
		}
		for _, l := range n.labels {
			if l == "le" && suffix == "_bucket" {
				continue
			}
			if !slices.ContainsFunc(fam.Metric, func(m *dto.Metric) bool {
				return slices.ContainsFunc(m.Label, func(lp *dto.LabelPair) bool { return lp.GetName() == l })
			}) {
				missing = append(missing, fmt.Sprintf("%s{%s} (in %s)", n.metric, l, n.query))
			}
		}
	}
	return missing, nil
}

// TestDashboardMatchesMetrics: every metric the Grafana dashboard queries (and every
// label it matches on or groups by) is on a real gateway's /metrics, once the gateway
// has done what each panel shows: a request answered, a job run, the result cache
// open, a message dropped, a gated lease held. The dashboard and the metrics cannot
// drift apart.
func TestDashboardMatchesMetrics(t *testing.T) {
	needs := dashboardNeeds(t, dashboardPath)
	root := imageRoot(t)
	img := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		Root:     root,
		StoreDir: t.TempDir(),
		Cache:    config.Cache{Enabled: true},
		Devices:  map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}},
		Pools:    []gwPool{{Name: "cpu", Version: "1.24.3", Workers: 1, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
		Classes:  []gwClass{{Name: "interactive", Chain: []string{"cpu"}}, {Name: "batch", Chain: []string{"cpu"}}},
	}.write(t))
	g.waitLive(t, "cpu", 1)
	c := client.New(g.NC)
	ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancel()
	if _, err := c.Tag(ctx, codec.Request{Path: img, Model: gwTagger}); err != nil {
		t.Fatal(err)
	}
	// A request without a reply subject is dropped, and counted.
	b, _ := codec.Marshal(&codec.Request{Path: img})
	if err := g.NC.Publish("ortbus.v1.tag", b); err != nil {
		t.Fatal(err)
	}
	// The job store opens in the background: submit once the gateway says it is open.
	g.awaitJobStore(t)
	sub, err := c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Model: gwTagger, Items: []string{img}})
	if err != nil {
		t.Fatal(err)
	}
	job := sub.Job
	if st, err := c.WatchJob(ctx, job, 50*time.Millisecond, nil); err != nil || st.State != codec.JobDone {
		t.Fatalf("job %s: %+v, %v", job, st, err)
	}
	l, err := c.Lease(ctx, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cpu", Bytes: 1 << 20, Class: "batch", Holder: "dashboard", TTLMS: 60_000, Gate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.ReleaseLease(context.Background(), l.Lease)

	var missing []string
	checkFor(t, "every series the dashboard reads on /metrics", gwReplyBound, pollEvery, func() error {
		var err error
		if missing, err = missingSeries(gwScrape(t, g.Ready.HTTP), needs); err != nil {
			t.Fatalf("/metrics does not parse: %v", err)
		}
		if len(missing) > 0 {
			return fmt.Errorf("missing:\n  %s", strings.Join(missing, "\n  "))
		}
		return nil
	})
	t.Logf("%d series needs of %s found", len(needs), dashboardPath)
}

// The check itself fails on a metric or a label the scrape lacks, and takes a
// histogram's parts from its family.
func TestDashboardCheckFindsDrift(t *testing.T) {
	scrape := "# TYPE ortbus_queued gauge\nortbus_queued{class=\"batch\"} 0\n" +
		"# TYPE ortbus_request_seconds histogram\nortbus_request_seconds_bucket{class=\"batch\",le=\"+Inf\"} 1\nortbus_request_seconds_sum{class=\"batch\"} 1\nortbus_request_seconds_count{class=\"batch\"} 1\n"
	p := parser.NewParser(parser.Options{})
	for q, want := range map[string]int{
		`sum by (class) (ortbus_queued)`: 0,
		`histogram_quantile(0.9, sum by (class, le) (rate(ortbus_request_seconds_bucket[5m])))`: 0,
		`sum by (pool) (ortbus_queued)`:                  1,
		`ortbus_nope`:                                    1,
		`ortbus_queued{device="x"} + ortbus_nope{a="b"}`: 2,
	} {
		expr, err := p.ParseExpr(q)
		if err != nil {
			t.Fatal(err)
		}
		missing, err := missingSeries(scrape, selectorNeeds(expr, q))
		if err != nil || len(missing) != want {
			t.Errorf("%s: missing %v (%v), want %d", q, missing, err, want)
		}
	}
}

// TestDashboardImportInputs: Grafana's import dialog asks for the Prometheus data source
// through the dashboard's __inputs (DS_PROMETHEUS), which the data source variable takes
// as its value and every query reads through the variable; no other input is referred to.
func TestDashboardImportInputs(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Inputs []struct {
			Name, Type, PluginID string
		} `json:"__inputs"`
		Templating struct {
			List []struct {
				Name, Type string
				Current    struct{ Value any } `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, in := range dash.Inputs {
		declared[in.Name] = true
		if in.Name == "DS_PROMETHEUS" && (in.Type != "datasource" || in.PluginID != "prometheus") {
			t.Errorf("input DS_PROMETHEUS: %+v, want a prometheus datasource", in)
		}
	}
	if !declared["DS_PROMETHEUS"] {
		t.Fatalf("no __inputs entry DS_PROMETHEUS: %+v", dash.Inputs)
	}
	for _, m := range regexp.MustCompile(`\$\{(DS_[A-Z0-9_]+)\}`).FindAllStringSubmatch(string(b), -1) {
		if !declared[m[1]] {
			t.Errorf("${%s} is used but not declared in __inputs", m[1])
		}
	}
	var v *struct {
		Name, Type string
		Current    struct{ Value any } `json:"current"`
	}
	for i := range dash.Templating.List {
		if dash.Templating.List[i].Type == "datasource" {
			v = &dash.Templating.List[i]
		}
	}
	if v == nil || v.Current.Value != "${DS_PROMETHEUS}" {
		t.Fatalf("the data source variable %+v does not take DS_PROMETHEUS", v)
	}
	// Every query's data source is the variable.
	for _, m := range regexp.MustCompile(`"uid":\s*"([^"]*)"`).FindAllStringSubmatch(string(b), -1) {
		if m[1] != "${"+v.Name+"}" && m[1] != "ortbus" {
			t.Errorf("a data source uid %q, want ${%s}", m[1], v.Name)
		}
	}
}
