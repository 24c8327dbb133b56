package devices

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
)

// useTree points procRoot and sysRoot at testdata/NAME/proc and testdata/NAME/sys (or at
// any other root given as a path).
func useTree(t *testing.T, root string) {
	t.Helper()
	if !filepath.IsAbs(root) {
		root = filepath.Join("testdata", root)
	}
	oldProc, oldSys := procRoot, sysRoot
	procRoot, sysRoot = filepath.Join(root, "proc"), filepath.Join(root, "sys")
	t.Cleanup(func() { procRoot, sysRoot = oldProc, oldSys })
}

// TestDRMCards: drm:N names /sys/class/drm/cardN, its PCI address the last element of the
// device link's target and its driver the uevent's DRIVER; a name that is not drm:N with N
// written plainly, or no card, is an error (never a path walked elsewhere).
func TestDRMCards(t *testing.T) {
	for _, c := range []struct{ tree, device, pdev, driver string }{
		{"amdgpu", "drm:0", "0000:03:00.0", "amdgpu"},
		{"amdgpu", "drm:1", "0000:13:00.0", "amdgpu"},
		{"amdgpu-old", "drm:0", "0000:0b:00.0", "amdgpu"},
		{"i915", "drm:0", "0000:00:02.0", "i915"},
		{"i915", "drm:1", "0000:03:00.0", "i915"},
		{"xe", "drm:1", "0000:03:00.0", "xe"},
	} {
		card, err := drmCardOf(filepath.Join("testdata", c.tree, "sys"), c.device)
		if err != nil || card.pdev != c.pdev || card.driver != c.driver {
			t.Errorf("%s %s: %+v %v, want %s %s", c.tree, c.device, card, err, c.pdev, c.driver)
		}
	}
	for _, d := range []string{"drm:", "drm:x", "drm:-1", "drm:01", "drm:+1", "drm:0/../1", "drm:1 ", "drm:7", "cuda:0"} {
		if card, err := drmCardOf(filepath.Join("testdata", "amdgpu", "sys"), d); err == nil {
			t.Errorf("%q: %+v, want an error", d, card)
		}
	}
	if isPCIAddress("fd5000.gpu") || isPCIAddress("0000:03:00") || isPCIAddress("0000:3:00.0") || !isPCIAddress("10000:e1:00.0") {
		t.Error("isPCIAddress")
	}
}

// TestDRMCapacity: each driver's capacity from its sysfs file; an integrated GPU that
// publishes none has the host's memory, and says so; a discrete one that publishes none
// asks for its capacity in the config.
func TestDRMCapacity(t *testing.T) {
	for _, c := range []struct {
		tree, device string
		bytes        int64
		src          string // a part of the source
		used         int64  // -1: no reader
	}{
		{"amdgpu", "drm:0", 25753026560, "amdgpu sysfs mem_info_vram_total", 5603590144},
		{"amdgpu", "drm:1", 536870912, "mem_info_vram_total", 61472768},
		{"amdgpu-old", "drm:0", 17163091968, "mem_info_vram_total", 1392508928},
		{"i915", "drm:0", 65640788 << 10, "host memory (/proc/meminfo): drm:0 is an integrated GPU (PCI 0000:00:02.0)", -1},
		{"xe", "drm:0", 32169044 << 10, "integrated GPU (PCI 0000:00:02.0)", -1},
		{"xe", "drm:1", 8 << 30, "xe sysfs tile*/physical_vram_size_bytes", -1},
	} {
		t.Run(c.tree+"/"+c.device, func(t *testing.T) {
			useTree(t, c.tree)
			b, src, err := Capacity(c.device)
			if err != nil || b != c.bytes || !strings.Contains(src, c.src) {
				t.Fatalf("capacity %d from %q: %v; want %d from %q", b, src, err, c.bytes, c.src)
			}
			used, ok := Used(c.device)
			if c.used < 0 && ok || c.used >= 0 && (!ok || used != c.used) {
				t.Fatalf("used %d %v, want %d", used, ok, c.used)
			}
		})
	}
	useTree(t, "i915")
	if b, src, err := Capacity("drm:1"); err == nil || !strings.Contains(err.Error(), `devices."drm:1".capacity`) || !strings.Contains(err.Error(), "i915") {
		t.Errorf("discrete i915 without lmem_total_bytes: %d %q %v, want an error asking for its capacity", b, src, err)
	}
	if _, _, err := Capacity("drm:9"); err == nil || !strings.Contains(err.Error(), `devices."drm:9".capacity`) {
		t.Errorf("no card: %v", err)
	}
	if _, _, err := Capacity("drm:x"); err == nil {
		t.Error("drm:x: no error")
	}
}

// fakeTree is a machine made in a temporary directory: cards under sys, processes under
// proc.
type fakeTree struct {
	t    *testing.T
	root string
}

func newFakeTree(t *testing.T) *fakeTree {
	ft := &fakeTree{t: t, root: t.TempDir()}
	useTree(t, ft.root)
	return ft
}

func (f *fakeTree) file(rel, text string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeTree) link(rel, target string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		f.t.Fatal(err)
	}
}

// card makes sys/class/drm/cardN with its device dir sys/devices/ADDR holding files.
func (f *fakeTree) card(n, addr, driver string, files map[string]string) {
	f.t.Helper()
	f.file("sys/devices/"+addr+"/uevent", "DRIVER="+driver+"\nPCI_SLOT_NAME="+addr+"\n")
	for name, text := range files {
		f.file("sys/devices/"+addr+"/"+name, text)
	}
	f.link("sys/class/drm/card"+n+"/device", "../../../devices/"+addr)
}

// client is the fdinfo of an xe client on pdev with vram0 resident bytes (and no client
// id when id is "").
func client(pdev, id string, vram string) string {
	s := "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t900\ndrm-driver:\txe\n"
	if id != "" {
		s += "drm-client-id:\t" + id + "\n"
	}
	return s + "drm-pdev:\t" + pdev + "\ndrm-total-gtt:\t4 KiB\ndrm-resident-gtt:\t4 KiB\ndrm-total-vram0:\t" + vram + "\ndrm-resident-vram0:\t" + vram + "\n"
}

// TestDRMCapacityOther: i915's lmem_total_bytes (Intel's backported driver), xe's tiles
// summed, and what is not a capacity: a sysfs number that is no number, a card that is not
// a PCI device.
func TestDRMCapacityOther(t *testing.T) {
	f := newFakeTree(t)
	f.card("0", "0000:03:00.0", "i915", nil)
	f.file("sys/class/drm/card0/lmem_total_bytes", "17163091968\n")
	f.card("1", "0000:04:00.0", "xe", map[string]string{
		"tile0/physical_vram_size_bytes": "34359738368\n",
		"tile1/physical_vram_size_bytes": "34359738368\n",
	})
	f.card("2", "0000:05:00.0", "xe", map[string]string{"tile0/physical_vram_size_bytes": "lots\n"})
	f.card("3", "0000:06:00.0", "amdgpu", map[string]string{"mem_info_vram_total": strings.Repeat("1", maxSysfsBytes+1)})
	f.file("sys/devices/platform/fd5000.gpu/uevent", "DRIVER=panfrost\n")
	f.link("sys/class/drm/card4/device", "../../../devices/platform/fd5000.gpu")
	if b, src, err := Capacity("drm:0"); err != nil || b != 17163091968 || !strings.Contains(src, "i915 sysfs lmem_total_bytes") {
		t.Errorf("i915 lmem: %d %q %v", b, src, err)
	}
	if b, src, err := Capacity("drm:1"); err != nil || b != 64<<30 || !strings.Contains(src, "xe sysfs") {
		t.Errorf("xe, two tiles: %d %q %v", b, src, err)
	}
	for _, d := range []string{"drm:2", "drm:3", "drm:4"} {
		if b, src, err := Capacity(d); err == nil {
			t.Errorf("%s: %d %q, want an error", d, b, src)
		}
	}
	if _, ok := Used("drm:1"); ok {
		t.Error("xe has no used reader")
	}
}

// TestDRMProcessMemory reads every fixture's processes: each client counted once (the
// dup'ed fds of one client, a client inherited by a child), only those of the card's PCI
// address, its device-local regions on a discrete card and every region on an integrated
// one, resident before total before amdgpu's older drm-memory.
func TestDRMProcessMemory(t *testing.T) {
	for _, c := range []struct {
		tree, device string
		want         map[int]int64
		why          string
	}{
		{"amdgpu", "drm:0", map[int]int64{4711: 1488 * mib, 5120: 3072 * mib},
			"4711: client 211 through fds 23 and 24 counted once, its resident vram (not its total, 1536 MiB, nor gtt or doorbell); its client 37 is on the other card"},
		{"amdgpu", "drm:1", map[int]int64{1893: 245 * mib, 4711: 18 * mib}, "the iGPU's clients only"},
		{"amdgpu-old", "drm:0", map[int]int64{2290: 811008 * kib, 3391: 262144 * kib},
			"drm-memory-vram; client 71 (fds 5 and 6 of 2290, inherited as fd 5 by 3391) counted once, at 2290"},
		{"i915", "drm:0", map[int]int64{6120: 1245 * mib, 6388: 2052 * kib}, "integrated: system0 and stolen-system0, resident"},
		{"i915", "drm:1", map[int]int64{6388: 2048 * mib}, "discrete: local0 resident only, not system0"},
		{"xe", "drm:0", map[int]int64{7412: 747 * mib}, "integrated: system + gtt + stolen, no drm-total-cycles-*"},
		{"xe", "drm:1", map[int]int64{7300: 1890 * mib}, "discrete: vram0 resident, not gtt"},
	} {
		t.Run(c.tree+"/"+c.device, func(t *testing.T) {
			useTree(t, c.tree)
			r := ProcessReaderFor(c.device)
			if r == nil {
				t.Fatal("no reader")
			}
			got, err := r.ProcessMemory(c.device)
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("%v %v, want %v (%s)", got, err, c.want, c.why)
			}
		})
	}
	useTree(t, "amdgpu")
	if got, err := ProcessReaderFor("drm:5").ProcessMemory("drm:5"); err == nil {
		t.Errorf("no card 5: %v, want an error", got)
	}
}

// TestDRMProcessUsage: one process's own clients on a card, from its fdinfo only.
func TestDRMProcessUsage(t *testing.T) {
	for _, c := range []struct {
		tree, device string
		pid          int
		want         int64
	}{
		{"amdgpu", "drm:0", 4711, 1488 * mib},
		{"amdgpu", "drm:1", 4711, 18 * mib},
		{"amdgpu", "drm:1", 5120, 0}, // a process without a client on that card
		{"amdgpu-old", "drm:0", 3391, (811008 + 262144) * kib},
		{"i915", "drm:0", 6120, 1245 * mib},
		{"i915", "drm:1", 6388, 2048 * mib},
		{"xe", "drm:0", 7412, 747 * mib},
		{"xe", "drm:1", 7300, 1890 * mib},
	} {
		useTree(t, c.tree)
		b, ok, err := ProcessUsage(c.device, c.pid)
		if err != nil || !ok || b != c.want {
			t.Errorf("%s %s pid %d: %d %v %v, want %d", c.tree, c.device, c.pid, b, ok, err, c.want)
		}
	}
	useTree(t, "amdgpu")
	for _, c := range []struct {
		device string
		pid    int
	}{{"drm:0", 999999}, {"drm:0", 0}, {"drm:0", -4}, {"drm:8", 4711}, {"drm:x", 4711}} {
		if b, ok, err := ProcessUsage(c.device, c.pid); err == nil || !ok {
			t.Errorf("%s pid %d: %d %v %v, want an error", c.device, c.pid, b, ok, err)
		}
	}
}

// TestDRMHostile: what a scan meets on a live machine and from processes it does not
// trust: fdinfo past its bounds, processes and fds that vanish while it reads, fds that
// are no DRM node, clients without an id, names in /proc that are no pid.
func TestDRMHostile(t *testing.T) {
	f := newFakeTree(t)
	const pdev = "0000:03:00.0"
	f.card("0", pdev, "xe", nil)
	// 100: an fdinfo past 64 KiB, and one with a line past 4 KiB, each a valid client
	// otherwise: skipped; the third counts.
	f.file("proc/100/fdinfo/3", client(pdev, "1", "7 MiB")+strings.Repeat("x-pad:\t0\n", maxFdinfoBytes/8))
	f.file("proc/100/fdinfo/4", client(pdev, "2", "7 MiB")+"drm-client-name:\t"+strings.Repeat("n", maxFdinfoLine)+"\n")
	f.file("proc/100/fdinfo/5", client(pdev, "3", "1 MiB"))
	// 200: exited between the listing of /proc and the reading of its fds.
	if err := os.MkdirAll(filepath.Join(f.root, "proc/200"), 0o755); err != nil {
		t.Fatal(err)
	}
	// 300: fd 7 closed between the listing of its fds and its read.
	f.link("proc/300/fdinfo/7", "/nonexistent/ortbus/closed-fd")
	f.file("proc/300/fdinfo/8", client(pdev, "4", "2 MiB"))
	// 400: fd 3 a socket (whatever its fdinfo says, it is not read), fd 4 a render node.
	f.link("proc/400/fd/3", "socket:[81234]")
	f.file("proc/400/fdinfo/3", client(pdev, "5", "100 MiB"))
	f.link("proc/400/fd/4", "/dev/dri/renderD128")
	f.file("proc/400/fdinfo/4", client(pdev, "6", "4 MiB"))
	// 500: two clients that print no id: each fd counts.
	f.file("proc/500/fdinfo/3", client(pdev, "", "1 MiB"))
	f.file("proc/500/fdinfo/4", client(pdev, "", "1 MiB"))
	// 600: a client whose memory lines are all malformed: listed, 0 bytes; a DRM fd
	// without drm-driver is no client.
	f.file("proc/600/fdinfo/3", "drm-driver:\txe\ndrm-client-id:\t7\ndrm-pdev:\t"+pdev+"\ndrm-resident-vram0:\tlots\ndrm-total-vram0:\t3 PiB\n")
	f.file("proc/700/fdinfo/3", "drm-client-id:\t8\ndrm-pdev:\t"+pdev+"\ndrm-resident-vram0:\t9 MiB\n")
	// Names in /proc that are no pid.
	f.file("proc/meminfo", "MemTotal:       1000 kB\n")
	f.link("proc/self", "100")
	f.file("proc/sys/kernel/pid_max", "4194304\n")
	f.file("proc/-5/fdinfo/3", client(pdev, "9", "9 MiB"))

	got, err := ProcessReaderFor("drm:0").ProcessMemory("drm:0")
	want := map[int]int64{100: 1 * mib, 300: 2 * mib, 400: 4 * mib, 500: 2 * mib, 600: 0}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %v, want %v", got, err, want)
	}
	if b, ok, err := ProcessUsage("drm:0", 200); err == nil || !ok {
		t.Errorf("a process that exited: %d %v %v, want an error", b, ok, err)
	}
	if b, ok, err := ProcessUsage("drm:0", 300); err != nil || !ok || b != 2*mib {
		t.Errorf("300: %d %v %v", b, ok, err)
	}
	// No /proc to list: an error, never an empty reading.
	if err := os.RemoveAll(filepath.Join(f.root, "proc")); err != nil {
		t.Fatal(err)
	}
	if got, err := ProcessReaderFor("drm:0").ProcessMemory("drm:0"); err == nil {
		t.Errorf("no /proc: %v, want an error", got)
	}
}

// TestParseSize: a number of bytes, or KiB, MiB, GiB of them; anything else, or a count
// past int64, is no size.
func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "8 KiB": 8 * kib, "1488 MiB": 1488 * mib, "2 GiB": 2 << 30, " 3\tKiB ": 3 * kib,
		"9223372036854775807": math.MaxInt64, "8589934591 GiB": 8589934591 << 30,
	} {
		if got, ok := parseSize(in); !ok || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "KiB", "-1", "1.5 MiB", "12 kB", "1 TiB", "3 PiB", "1 KiB x", "0x10",
		"9223372036854775808", "18446744073709551616", "9223372036854775807 KiB", "8589934592 GiB"} {
		if got, ok := parseSize(in); ok {
			t.Errorf("%q: %d, want no size", in, got)
		}
	}
}

// TestParseFdinfo: the keys read, and those that only look like them.
func TestParseFdinfo(t *testing.T) {
	for _, c := range []struct {
		name, text string
		ok         bool
		want       int64
	}{
		{"no drm-driver: no client", "drm-pdev:\t0000:03:00.0\ndrm-resident-vram0:\t1 MiB\n", false, 0},
		{"not DRM", "pos:\t0\nflags:\t02004002\nmnt_id:\t16\nino:\t1057\neventfd-count:                0\neventfd-id: 12\n", false, 0},
		{"empty", "", false, 0},
		{"malformed lines skipped", "drm-driver:\txe\nno colon here\n:\n::::\ndrm-resident-:\t77\ndrm-resident-vram0:\tlots\n" +
			"drm-resident-vram0:\t5 PiB\ndrm-total-vram0:\t4 MiB\ndrm-resident-gtt:\t1 MiB\n", true, 4 * mib},
		{"a repeated key keeps its first value", "drm-driver:\txe\ndrm-resident-vram0:\t4 MiB\ndrm-resident-vram0:\t9 MiB\n", true, 4 * mib},
		{"total when no resident", "drm-driver:\ti915\ndrm-total-local0:\t3 MiB\ndrm-memory-local0:\t1 MiB\n", true, 3 * mib},
		{"memory when neither", "drm-driver:\tamdgpu\ndrm-memory-vram:\t1024 KiB\ndrm-memory-gtt: \t4096 KiB\n", true, 1 * mib},
		{"integrated: every region, not cycles", "drm-driver:\txe\ndrm-resident-system:\t1 MiB\ndrm-resident-gtt:\t2 MiB\ndrm-resident-stolen:\t1 MiB\n" +
			"drm-total-cycles-rcs:\t7655183225\ndrm-cycles-rcs:\t1\ndrm-engine-capacity-vcs:\t2\n", true, 4 * mib},
		{"core's memory region", "drm-driver:\tpanthor\ndrm-total-memory:\t8 MiB\ndrm-resident-memory:\t6 MiB\npanthor-resident-memory:\t1 MiB\n", true, 6 * mib},
		{"stolen-local is not local", "drm-driver:\ti915\ndrm-resident-stolen-local0:\t8 MiB\ndrm-resident-system0:\t1 MiB\ndrm-resident-local0:\t2 MiB\n", true, 2 * mib},
		{"sums saturate", "drm-driver:\txe\ndrm-resident-vram0:\t9223372036854775807\ndrm-resident-vram1:\t9223372036854775807\n", true, math.MaxInt64},
		{"a line past 4 KiB", "drm-driver:\txe\ndrm-resident-vram0:\t1 MiB\ndrm-client-name:\t" + strings.Repeat("n", maxFdinfoLine) + "\n", false, 0},
	} {
		got, ok := parseFdinfo([]byte(c.text))
		if ok != c.ok || got.bytes != c.want {
			t.Errorf("%s: %+v %v, want %v %d", c.name, got, ok, c.ok, c.want)
		}
	}
	c, ok := parseFdinfo([]byte("drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t211\n"))
	if !ok || c.driver != "amdgpu" || c.pdev != "0000:03:00.0" || c.id != "211" || c.bytes != 0 {
		t.Errorf("identification: %+v %v", c, ok)
	}
}

// FuzzParseFdinfo: no text makes the parser panic or count a negative size.
func FuzzParseFdinfo(f *testing.F) {
	for _, p := range []string{
		"testdata/amdgpu/proc/4711/fdinfo/23", "testdata/amdgpu-old/proc/2290/fdinfo/5",
		"testdata/i915/proc/6388/fdinfo/18", "testdata/xe/proc/7412/fdinfo/6",
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("drm-driver:\x00\ndrm-resident-vram\xff: 1 KiB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, ok := parseFdinfo(b); ok && c.bytes < 0 {
			t.Fatalf("negative %d", c.bytes)
		}
	})
}

// TestProcessSource names each device's per-process reader.
func TestProcessSource(t *testing.T) {
	for d, want := range map[string]string{"cuda:0": "nvidia-smi", "drm:1": "drm-fdinfo", "cpu": "", "gpu.intel:0": ""} {
		if got := ProcessSource(d); got != want {
			t.Errorf("%s: %q, want %q", d, got, want)
		}
	}
}
