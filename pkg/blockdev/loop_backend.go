package blockdev

import "errors"

var errTODO = errors.New("not implemented yet")
