package ublk

import (
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk/internal/uapi"
)

func TestAddFlags(t *testing.T) {
	const base = FlagCmdIoctlEncode | FlagUserRecovery | FlagUserRecoveryReissue
	k612 := FlagURingCmdCompInTask | FlagNeedGetData | FlagUserRecovery | FlagUserRecoveryReissue |
		FlagUnprivilegedDev | FlagCmdIoctlEncode | FlagUserCopy | FlagZoned
	k73 := uint64(0x1fffff)
	cases := []struct {
		name     string
		features uint64
		mode     Mode
		batch    Mode
		uc       Mode
		want     uint64
		wantErr  bool
	}{
		{"6.12 auto copies through the char device", k612, ModeAuto, ModeAuto, ModeAuto, base | FlagUserCopy, false},
		{"6.12 user copy off copies per tag", k612, ModeAuto, ModeAuto, ModeOff, base, false},
		{"6.12 zero copy on refused", k612, ModeOn, ModeAuto, ModeAuto, 0, true},
		{"6.12 batch on refused", k612, ModeAuto, ModeOn, ModeAuto, 0, true},
		{"7.3 auto zero copy in batches", k73, ModeAuto, ModeAuto, ModeAuto, base | FlagUpdateSize | FlagQuiesce | FlagNoAutoPartScan | FlagAutoBufReg | FlagBatchIO, false},
		{"7.3 user copy on yields to zero copy", k73, ModeAuto, ModeOff, ModeOn, base | FlagUpdateSize | FlagQuiesce | FlagNoAutoPartScan | FlagAutoBufReg, false},
		{"7.3 zero copy off copies through the char device", k73, ModeOff, ModeOff, ModeAuto, base | FlagUpdateSize | FlagQuiesce | FlagNoAutoPartScan | FlagUserCopy, false},
		{"7.3 batch in auto wins over user copy", k73, ModeOff, ModeAuto, ModeAuto, base | FlagUpdateSize | FlagQuiesce | FlagNoAutoPartScan | FlagBatchIO, false},
		{"7.3 batch with user copy on refused", k73, ModeOff, ModeOn, ModeOn, 0, true},
		{"7.3 all off copies per tag", k73, ModeOff, ModeOff, ModeOff, base | FlagUpdateSize | FlagQuiesce | FlagNoAutoPartScan, false},
		{"user copy on without USER_COPY refused", base, ModeAuto, ModeAuto, ModeOn, 0, true},
		{"no recovery refused", FlagCmdIoctlEncode, ModeAuto, ModeAuto, ModeAuto, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := addFlags(c.features, c.mode, c.batch, c.uc)
			if c.wantErr {
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("err = %v, want ErrUnsupported", err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("addFlags = %s, %v; want %s", FormatFlags(got), err, FormatFlags(c.want))
			}
		})
	}
}

func TestFlagNames(t *testing.T) {
	got := FlagNames(FlagUserRecovery | FlagAutoBufReg | 1<<40)
	if want := []string{"USER_RECOVERY", "AUTO_BUF_REG", "bit 40"}; !slices.Equal(got, want) {
		t.Fatalf("FlagNames = %q, want %q", got, want)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeAuto, "auto": ModeAuto, "on": ModeOn, "off": ModeOff} {
		if got, err := ParseMode("zero copy", in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("zero copy", "yes"); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("ParseMode(yes) = %v, want os.ErrInvalid", err)
	}
}

func TestCPUsOf(t *testing.T) {
	mask := make([]byte, 16)
	mask[0], mask[1], mask[15] = 0b101, 0b1, 0x80
	if got, want := cpusOf(mask), []int{0, 2, 8, 127}; !slices.Equal(got, want) {
		t.Fatalf("cpusOf = %v, want %v", got, want)
	}
}

// TestPutCtrlCmd checks the little-endian encoding of ublksrv_ctrl_cmd.
func TestPutCtrlCmd(t *testing.T) {
	b := make([]byte, 80)
	for i := range b {
		b[i] = 0xee
	}
	putCtrlCmd(b, uapi.CtrlCmd{DevID: 7, QueueID: noQueue, Len: 64, Addr: 0x1122334455667788, Data: 42})
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != 7 || le.Uint16(b[4:]) != 0xffff || le.Uint16(b[6:]) != 64 ||
		le.Uint64(b[8:]) != 0x1122334455667788 || le.Uint64(b[16:]) != 42 || le.Uint64(b[24:]) != 0 {
		t.Fatalf("encoded % x", b[:32])
	}
	if b[32] != 0xee {
		t.Fatal("wrote past the 32-byte command")
	}
}

func TestDeviceParams(t *testing.T) {
	p := deviceParams(DeviceConfig{SizeBytes: 1 << 30, DMAAlign: 4}, DevInfo{MaxIOBufBytes: 128 << 10})
	switch {
	case p.Len != uapi.SizeofParams || p.Types != uapi.ParamTypeBasic|uapi.ParamTypeDiscard|uapi.ParamTypeDMAAlign:
		t.Fatalf("len %d types %#x", p.Len, p.Types)
	case p.Basic.Attrs != uapi.AttrVolatileCache|uapi.AttrFUA || p.Basic.LogicalBSShift != 12:
		t.Fatalf("basic %+v", p.Basic)
	case p.Basic.MaxSectors != 256 || p.Basic.DevSectors != 1<<21:
		t.Fatalf("basic sectors %+v", p.Basic)
	case p.Discard.MaxDiscardSegments != 1 || p.Discard.DiscardGranularity != 4096:
		t.Fatalf("discard %+v", p.Discard)
	case p.DMA.Alignment != 511:
		t.Fatalf("dma alignment %d, want 511", p.DMA.Alignment)
	}
	if ro := deviceParams(DeviceConfig{SizeBytes: 4096, ReadOnly: true}, DevInfo{}); ro.Basic.Attrs&uapi.AttrReadOnly == 0 {
		t.Fatal("read-only device without UBLK_ATTR_READ_ONLY")
	}
}
