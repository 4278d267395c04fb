package planted

import (
	"errors"
	"fmt"
	"log/slog"
)

// Each long text below is one the scan must find; the short ones it must
// pass.
func planted(log *slog.Logger, n int) error {
	log.Warn("a short log message", "n", n)
	log.Warn("a log message far too long for anyone to grep for: it explains the whole design, every option one could take instead, and where to read more about it, twice over, and then once more for luck")
	slog.InfoContext(nil, "a package-level log message far too long for anyone to grep for: it explains the whole design and every option one could take instead of it, twice, and then once more for luck")
	_ = refuse("a refusal far too long for anyone to grep for: it explains the whole design of the feature, every option one could take instead, and where to read, twice, and then once more %d", n)
	_ = errors.New("a short error")
	_ = errors.New("an error " + "far too long for anyone to grep for, written in two literals: it explains the whole design, every option one could take instead, and where to read more, and then once again")
	return fmt.Errorf("an error far too long for anyone to grep for: %d, and it explains the whole design, every option one could take instead, and where to read more about it, and once more", n)
}

func refuse(format string, a ...any) error { return fmt.Errorf(format, a...) }
