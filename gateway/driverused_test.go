package gateway

import (
	"testing"
	"time"
)

// TestDriverReadings: a device is read in the background only when its reading is older
// than driverReadAge, one reading at a time; the CPU never.
func TestDriverReadings(t *testing.T) {
	d := newDriverReadings()
	reads := map[string]int{} // by the reading goroutines, one at a time (release)
	release := make(chan struct{})
	stored := make(chan string, 8)
	d.read = func(device string) (int64, bool) {
		<-release
		reads[device]++
		return int64(reads[device]) << 20, device == "cuda:0"
	}
	d.stored = func(device string) { stored <- device }
	next := func(want string) {
		t.Helper()
		select {
		case dev := <-stored:
			if dev != want {
				t.Fatalf("read %s, want %s", dev, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s was never read", want)
		}
	}
	t0 := time.Unix(1000, 0)
	if got := d.latest("cuda:0", t0); got != 0 {
		t.Fatalf("before any reading: %d", got)
	}
	d.latest("cuda:0", t0.Add(2*driverReadAge)) // one is under way: no second
	release <- struct{}{}
	next("cuda:0")
	if got := d.latest("cuda:0", t0.Add(driverReadAge/2)); got != 1<<20 {
		t.Errorf("a fresh reading: %d", got)
	}
	d.latest("cuda:0", t0.Add(driverReadAge)) // old: read again
	release <- struct{}{}
	next("cuda:0")
	if got := d.latest("cuda:0", t0.Add(driverReadAge)); got != 2<<20 {
		t.Errorf("the second reading: %d", got)
	}
	if got := d.latest("cpu", t0); got != 0 {
		t.Errorf("cpu: %d", got)
	}
	d.latest("drm:1", t0)
	release <- struct{}{}
	next("drm:1")
	if got := d.latest("drm:1", t0); got != 0 {
		t.Errorf("a device without a reading: %d", got)
	}
	if reads["cuda:0"] != 2 || reads["cpu"] != 0 || reads["drm:1"] != 1 {
		t.Errorf("reads %v, want cuda:0 twice, drm:1 once, cpu never", reads)
	}
}
