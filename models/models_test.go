package models

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

func TestHFCacheDiscovery(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HF_HOME", home)
	repo := filepath.Join(home, "hub", "models--deepghs--pixai-tagger")
	snap := filepath.Join(repo, "snapshots", "abc123")
	os.MkdirAll(snap, 0o755)
	os.MkdirAll(filepath.Join(repo, "refs"), 0o755)
	os.WriteFile(filepath.Join(repo, "refs", "main"), []byte("abc123\n"), 0o644)

	m := &config.Model{Name: "t", Kind: "tagger-pixai", HFRepo: "deepghs/pixai-tagger"}
	if d, err := Dir(m); err != nil || d != snap {
		t.Fatalf("refs/main: %q %v", d, err)
	}
	m.HFRevision = "abc123"
	if d, err := Dir(m); err != nil || d != snap {
		t.Fatalf("explicit revision: %q %v", d, err)
	}
	m.HFRevision = "v2"
	if _, err := Dir(m); codec.CodeOf(err) != codec.CodeUnknownModel {
		t.Fatalf("missing revision: %v", err)
	}
	m2 := &config.Model{Name: "x", HFRepo: "org/absent"}
	if _, err := Dir(m2); codec.CodeOf(err) != codec.CodeUnknownModel {
		t.Fatalf("absent repo: %v", err)
	}
	m3 := &config.Model{Name: "d", Dir: "/models/d"}
	if d, _ := Dir(m3); d != "/models/d" {
		t.Fatalf("explicit dir: %q", d)
	}
}

func TestLabelFiles(t *testing.T) {
	dir := t.TempDir()
	tags := filepath.Join(dir, "selected_tags.csv")
	os.WriteFile(tags, []byte("id,tag_id,name,category,count,ips\n1,11,hero,4,5,\"[\"\"land\"\"]\"\n0,10,red,0,9,[]\n2,12,general,9,1,\n"), 0o644)
	got, err := readTags(tags)
	if err != nil {
		t.Fatal(err)
	}
	want := []Tag{{Name: "red", Category: 0, IPs: []string{}}, {Name: "hero", Category: 4, IPs: []string{"land"}}, {Name: "general", Category: 9}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("tags %+v", got)
	}
	th := filepath.Join(dir, "thresholds.csv")
	os.WriteFile(th, []byte("category,name,threshold\n0,red,0.7\n"), 0o644)
	if m, err := readThresholds(th); err != nil || m["red"] != 0.7 {
		t.Fatalf("thresholds %v %v", m, err)
	}
	os.WriteFile(tags, []byte("name,category\nred,zero\n"), 0o644)
	if _, err := readTags(tags); err == nil {
		t.Fatal("bad category accepted")
	}
}

func f64(v float64) *float64 { return &v }

func TestTaggerDecode(t *testing.T) {
	tg := &tagger{
		tags: []Tag{
			{Name: "red", Category: CatGeneral}, {Name: "blue", Category: CatGeneral},
			{Name: "hero", Category: CatCharacter, IPs: []string{"b", "a"}}, {Name: "villain", Category: CatCharacter, IPs: []string{"a"}},
			{Name: "general", Category: CatRating},
		},
		thresholds: map[string]float32{"blue": 0.2},
		general:    0.4, character: 0.4,
	}
	r := tg.decode([]float32{0.5, 0.3, 0.9, 0.8, 0.1}, nil)
	if !reflect.DeepEqual(r.General, map[string]float32{"red": 0.5, "blue": 0.3}) {
		t.Fatalf("general %v (per-tag threshold of blue is 0.2)", r.General)
	}
	if len(r.Character) != 2 || !reflect.DeepEqual(r.IPs, []string{"a", "b"}) || r.Rating["general"] != 0.1 {
		t.Fatalf("character %v ips %v rating %v", r.Character, r.IPs, r.Rating)
	}
	// A request threshold overrides the file's per-tag threshold for its category.
	r = tg.decode([]float32{0.5, 0.3, 0.9, 0.8, 0.1}, &codec.Thresholds{General: f64(0.45), Character: f64(0.85)})
	if !reflect.DeepEqual(r.General, map[string]float32{"red": 0.5}) || len(r.Character) != 1 || !reflect.DeepEqual(r.IPs, []string{"a", "b"}) {
		t.Fatalf("override: general %v character %v ips %v", r.General, r.Character, r.IPs)
	}
}

func TestNMS(t *testing.T) {
	boxes := []codec.Box{
		{X1: 0, Y1: 0, X2: 10, Y2: 10, Label: "person", Score: 0.8},
		{X1: 1, Y1: 1, X2: 11, Y2: 11, Label: "person", Score: 0.9},
		{X1: 1, Y1: 1, X2: 11, Y2: 11, Label: "cat", Score: 0.5},
		{X1: 50, Y1: 50, X2: 60, Y2: 60, Label: "person", Score: 0.7},
	}
	got := nms(boxes, 0.5)
	if len(got) != 3 || got[0].Score != 0.9 || got[1].Score != 0.7 || got[2].Label != "cat" {
		t.Fatalf("nms %+v", got)
	}
}
