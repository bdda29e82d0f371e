package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// fioRate runs fio on a raw device for 4 s (rw, bs, iodepth) and returns
// the IOPS and bytes per second it measured, reads plus writes.
func fioRate(t *testing.T, dev, rw, bs string, depth int) (iops, bps float64) {
	t.Helper()
	out, err := exec.Command(fioPath(), "--name=rate", "--filename="+dev, "--rw="+rw, "--bs="+bs,
		fmt.Sprintf("--iodepth=%d", depth), "--direct=1", "--ioengine=libaio", "--time_based", "--runtime=4",
		"--size=64M", "--output-format=json").Output()
	if err != nil {
		t.Fatalf("fio %s %s: %v\n%s", rw, bs, err, out)
	}
	var res struct {
		Jobs []struct {
			Read, Write struct {
				IOPS  float64 `json:"iops"`
				Bytes float64 `json:"bw_bytes"`
			}
		}
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio json: %v\n%s", err, out)
	}
	j := res.Jobs[0]
	return j.Read.IOPS + j.Write.IOPS, j.Read.Bytes + j.Write.Bytes
}

// within fails unless got is within [lo, hi] × want.
func within(t *testing.T, what string, got, want, lo, hi float64) {
	t.Helper()
	if got < lo*want || got > hi*want {
		t.Errorf("%s: %.0f, want %.0f (%.2f..%.2f×)", what, got, want, lo, hi)
	} else {
		t.Logf("%s: %.0f (limit %.0f, %.3f×)", what, got, want, got/want)
	}
}

// paced measures a paced rate and fails unless it is within [lo, hi] ×
// want. Above the limit fails at once. Below it, the rate is measured once
// more: a guest stalled by a busy host for a second loses that second's
// I/O for good, as the limiter keeps only qos.Burst of credit by design
// (seen once in CI: 0.69× on an overloaded host, 1.03× in every run
// before and since), while a limiter that underdelivers fails both times.
func paced(t *testing.T, what string, measure func() float64, want, lo, hi float64) {
	t.Helper()
	got := measure()
	if got >= lo*want && got <= hi*want {
		t.Logf("%s: %.0f (limit %.0f, %.3f×)", what, got, want, got/want)
		return
	}
	if got < lo*want {
		t.Logf("%s: %.0f, below %.2f× the limit %.0f; measuring once more", what, got, lo, want)
		got = measure()
	}
	within(t, what, got, want, lo, hi)
}

// TestRateLimits proves the StorageClass's maxIOPS and maxBandwidth pace
// the device: fio far below what the device does unpaced measures the
// limit; ControllerModifyVolume changes it on the live device; the limit
// survives a kill -9 and re-adoption; /metrics shows limit and throttling.
func TestRateLimits(t *testing.T) {
	p := newPlugin(t)
	v := p.provision("paced", 128<<20, blockCap(), map[string]string{"queues": "2", "queueDepth": "32", "maxIOPS": "400"})
	dev := p.devLink(v)
	labels := fmt.Sprintf(`{device_class="default",name="paced",namespace="",persistentvolume="",persistentvolumeclaim="",volume_id="%s"}`, v.storeID())
	// Write the region fio uses once (64 requests, well within the
	// limit): random writes into the holes of the fresh sparse file
	// allocate blocks, which under emulation on 6.12 runs close to 1500
	// IOPS by itself, and this test is about the limiter, not allocation.
	if out, err := exec.Command(fioPath(), "--name=fill", "--filename="+dev, "--rw=write", "--bs=1M",
		"--direct=1", "--ioengine=libaio", "--iodepth=4", "--size=64M").CombinedOutput(); err != nil {
		t.Fatalf("fio fill: %v\n%s", err, out)
	}

	// 4 s at the limit plus the 50 ms burst; fio's ramp may lose a little.
	paced(t, "randread qd32 at maxIOPS 400", func() float64 {
		iops, _ := fioRate(t, dev, "randread", "4k", 32)
		return iops
	}, 400, 0.9, 1.05)
	if l := p.metric("fastblk_volume_limit_iops" + labels); l != 400 {
		t.Errorf("limit metric = %v, want 400", l)
	}
	if n := p.metric("fastblk_volume_throttled_ios_total" + labels); n < 1000 {
		t.Errorf("throttled I/Os = %v after 4 s of qd32 at 400 IOPS, want most of them", n)
	}

	modify := func(params map[string]string) {
		t.Helper()
		if _, err := p.ctrl.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{
			VolumeId: v.id, MutableParameters: params}); err != nil {
			t.Fatalf("ControllerModifyVolume %v: %v\n%s", params, err, p.logTail())
		}
	}
	modify(map[string]string{"maxIOPS": "1500"})
	paced1500, _ := fioRate(t, dev, "randwrite", "4k", 32)
	if paced1500 > 1.05*1500 {
		t.Errorf("randwrite qd32 after modify to maxIOPS 1500: %.0f, above the limit", paced1500)
	}

	modify(map[string]string{"maxIOPS": "0", "maxBandwidth": "8Mi"})
	paced(t, "1M read qd4 at maxBandwidth 8Mi", func() float64 {
		_, bps := fioRate(t, dev, "read", "1M", 4)
		return bps
	}, 8<<20, 0.85, 1.1)

	// The limit is the device's, and it outlives the process.
	p.kill9()
	p.start()
	paced(t, "1M write qd4 at maxBandwidth 8Mi after kill -9", func() float64 {
		_, bps := fioRate(t, dev, "write", "1M", 4)
		return bps
	}, 8<<20, 0.85, 1.1)
	if l := p.metric("fastblk_volume_limit_bytes_per_second" + labels); l != 8<<20 {
		t.Errorf("bandwidth limit metric after restart = %v, want %d", l, 8<<20)
	}

	// Lifted: the device runs unpaced again.
	modify(map[string]string{"maxBandwidth": "0"})
	iops, _ := fioRate(t, dev, "randread", "4k", 32)
	if iops < 2*400 {
		t.Errorf("randread qd32 with the limits lifted: %.0f IOPS, want well above the first limit (400)", iops)
	}
	t.Logf("unpaced randread qd32: %.0f IOPS", iops)
	// The raised limit was reached where the device could reach it: a
	// loaded host (emulated VM) may serve fewer than 1500 writes a second
	// unpaced, and the limiter must not be blamed for that.
	unpacedW, _ := fioRate(t, dev, "randwrite", "4k", 32)
	t.Logf("unpaced randwrite qd32: %.0f IOPS", unpacedW)
	can := min(1500, unpacedW)
	if paced1500 < 0.9*can {
		// Measured once more, as paced does (CI saw 0.89x once).
		t.Logf("randwrite qd32 at maxIOPS 1500: %.0f, below 0.9x of %.0f; measuring once more", paced1500, can)
		modify(map[string]string{"maxIOPS": "1500"})
		paced1500, _ = fioRate(t, dev, "randwrite", "4k", 32)
	}
	within(t, "randwrite qd32 after modify to maxIOPS 1500", paced1500, can, 0.9, 1.05*1500/can)
}

// TestRateLimitsOnCreate proves limits given as mutable parameters at
// creation (a VolumeAttributesClass) apply from the first stage.
func TestRateLimitsOnCreate(t *testing.T) {
	p := newPlugin(t)
	v := p.provisionReq(&csi.CreateVolumeRequest{Name: "vac", MutableParameters: map[string]string{"maxIOPS": "300"},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	paced(t, "randread qd16 at maxIOPS 300 from the mutable parameters", func() float64 {
		iops, _ := fioRate(t, p.devLink(v), "randread", "4k", 16)
		return iops
	}, 300, 0.9, 1.05)
}
