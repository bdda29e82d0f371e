package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestDeployArgsParse proves the plugin accepts every argument the chart
// gives it (deploy/ is the chart rendered with default values and kept
// fresh by test/chart), and that they mean what the values say.
func TestDeployArgsParse(t *testing.T) {
	args := deployPluginArgs(t)
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("plugin args %q do not start with serve", args)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := serveFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("serve rejects the chart's arguments: %v", err)
	}
	if cfg.devices.Poll != time.Millisecond {
		t.Errorf("--ublk-poll = %v, want the chart's default 1ms", cfg.devices.Poll)
	}
	if cfg.devices.BatchIO != "off" {
		t.Errorf("--ublk-batch-io = %q, want the chart's default off", cfg.devices.BatchIO)
	}
	if cfg.backend != "auto" || cfg.store.Dir != "/var/lib/csi-fastblk" {
		t.Errorf("backend %q data dir %q, want the chart defaults", cfg.backend, cfg.store.Dir)
	}
}

// TestServeBatchIOFlag proves --ublk-batch-io takes off, auto and on and
// refuses anything else.
func TestServeBatchIOFlag(t *testing.T) {
	for _, arg := range []string{"off", "auto", "on", "yes"} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		err := fs.Parse([]string{"--ublk-batch-io=" + arg})
		if bad := arg == "yes"; (err != nil) != bad || !bad && cfg.devices.BatchIO != arg {
			t.Errorf("--ublk-batch-io=%s: %q, %v", arg, cfg.devices.BatchIO, err)
		}
	}
}

// TestServeNowaitWritesFlag proves --ublk-nowait-writes takes auto, on and
// off, refuses anything else, and is off without it.
func TestServeNowaitWritesFlag(t *testing.T) {
	for _, arg := range []string{"off", "auto", "on", "yes"} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		err := fs.Parse([]string{"--ublk-nowait-writes=" + arg})
		if bad := arg == "yes"; (err != nil) != bad || !bad && cfg.devices.NowaitWrites != arg {
			t.Errorf("--ublk-nowait-writes=%s: %q, %v", arg, cfg.devices.NowaitWrites, err)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if cfg := serveFlags(fs); fs.Parse(nil) != nil || cfg.devices.NowaitWrites != "off" {
		t.Errorf("without the flag: %q, want off", cfg.devices.NowaitWrites)
	}
}

// TestServeFailUnservedAfterFlag proves --ublk-fail-unserved-after takes a
// duration (0: never), refuses a negative one or anything else, and is a
// minute without it.
func TestServeFailUnservedAfterFlag(t *testing.T) {
	for arg, want := range map[string]time.Duration{"4s": 4 * time.Second, "0": 0, "-1s": -1, "soon": -1} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		err := fs.Parse([]string{"--ublk-fail-unserved-after=" + arg})
		if bad := want < 0; (err != nil) != bad || !bad && cfg.devices.FailUnservedAfter != want {
			t.Errorf("--ublk-fail-unserved-after=%s: %v, %v", arg, cfg.devices.FailUnservedAfter, err)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if cfg := serveFlags(fs); fs.Parse(nil) != nil || cfg.devices.FailUnservedAfter != time.Minute {
		t.Errorf("without the flag: %v, want 1m", cfg.devices.FailUnservedAfter)
	}
}

// TestServeMaxIOSizeFlag proves --max-io-size takes the StorageClass
// parameter's format and refuses what ublk cannot take.
func TestServeMaxIOSizeFlag(t *testing.T) {
	for arg, want := range map[string]int{"512Ki": 512 << 10, "1Mi": 1 << 20, "65536": 64 << 10} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		if err := fs.Parse([]string{"--max-io-size=" + arg}); err != nil || cfg.devices.Tuning.MaxIOBytes != want {
			t.Errorf("--max-io-size=%s: %d, %v; want %d", arg, cfg.devices.Tuning.MaxIOBytes, err, want)
		}
	}
	for _, arg := range []string{"2Mi", "1000", "big"} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		serveFlags(fs)
		if err := fs.Parse([]string{"--max-io-size=" + arg}); err == nil {
			t.Errorf("--max-io-size=%s parsed; want an error", arg)
		}
	}
}

// TestServeCopyBudgetFlag proves --copy-budget takes a share of IOPS
// from 0.01 to 0.9, or 0 for no pacing but the copies' rates, refuses
// anything else, and leaves the driver's default without it.
func TestServeCopyBudgetFlag(t *testing.T) {
	for arg, want := range map[string]float64{"0.2": 0.2, "0.05": 0.05, "0": -1} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := serveFlags(fs)
		if err := fs.Parse([]string{"--copy-budget=" + arg}); err != nil || cfg.driver.CopyBudget != want {
			t.Errorf("--copy-budget=%s: %v, %v; want %v", arg, cfg.driver.CopyBudget, err, want)
		}
	}
	for _, arg := range []string{"1", "-0.1", "0.001", "20%"} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		serveFlags(fs)
		if err := fs.Parse([]string{"--copy-budget=" + arg}); err == nil {
			t.Errorf("--copy-budget=%s parsed; want an error", arg)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if cfg := serveFlags(fs); fs.Parse(nil) != nil || cfg.driver.CopyBudget != 0 {
		t.Errorf("without the flag: %v, want 0 (the driver's default)", cfg.driver.CopyBudget)
	}
}

// deployPluginArgs returns the args of the csi-fastblk container in the
// DaemonSet of deploy/csi-fastblk.yaml.
func deployPluginArgs(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../deploy/csi-fastblk.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	for {
		var obj struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string   `yaml:"name"`
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode deploy/csi-fastblk.yaml: %v", err)
		}
		if obj.Kind != "DaemonSet" {
			continue
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			if c.Name == "csi-fastblk" {
				return c.Args
			}
		}
	}
	t.Fatal("no csi-fastblk container in a DaemonSet of deploy/csi-fastblk.yaml")
	return nil
}
