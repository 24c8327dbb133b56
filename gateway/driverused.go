package gateway

import (
	"sync"
	"time"

	"github.com/ortbus/ortbus/devices"
)

// driverReadings are the memory in use on each device as its driver reports it
// (devices.Used: nvidia-smi for cuda:N, sysfs for drm:N), every process's: the figure
// status shows beside ortbus's own accounting (DeviceStatus.DriverUsedBytes). They are
// read only while someone looks: a status that finds a device's reading older than
// driverReadAge starts one reading of it in the background and shows the latest one,
// so the driver is asked at most once per driverReadAge per device, and never while no
// status is asked. The CPU has no such reading.
type driverReadings struct {
	read func(device string) (int64, bool) // devices.Used; a test's own
	// stored, when set (a test), is called after each reading is stored.
	stored func(device string)

	mu sync.Mutex
	by map[string]*driverReading
}

// driverReading is one device's latest reading.
type driverReading struct {
	at      time.Time // when the latest reading was started
	bytes   int64
	ok      bool
	reading bool // one is under way
}

// driverReadAge is how old a reading may be before a status asks for a new one.
const driverReadAge = time.Second

func newDriverReadings() *driverReadings {
	return &driverReadings{read: devices.Used, by: map[string]*driverReading{}}
}

// latest is device's latest reading (0 when there is none yet, or none at all), a new
// one started in the background when it is older than driverReadAge.
func (d *driverReadings) latest(device string, now time.Time) int64 {
	if d == nil || device == "cpu" {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.by[device]
	if r == nil {
		r = &driverReading{}
		d.by[device] = r
	}
	if !r.reading && now.Sub(r.at) >= driverReadAge {
		r.reading, r.at = true, now
		go func() {
			b, ok := d.read(device)
			d.mu.Lock()
			r.bytes, r.ok, r.reading = b, ok, false
			stored := d.stored
			d.mu.Unlock()
			if stored != nil {
				stored(device)
			}
		}()
	}
	if !r.ok {
		return 0
	}
	return r.bytes
}
