package sim

import (
	"fmt"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePlot draws results.png: training loss, test accuracy and the
// optimality gap F(x^t) - F* (log scale) per round, one line per algorithm.
func (r *Results) WritePlot(w io.Writer) error {
	panels := []struct {
		title, y string
		val      func(Round) float64
		log      bool
	}{
		{"training loss F(x)", "loss", func(x Round) float64 { return float64(x.TrainLoss) }, false},
		{"test accuracy", "accuracy", func(x Round) float64 { return float64(x.TestAccuracy) }, false},
		{fmt.Sprintf("optimality gap F(x) - F*  (F* = %.6g)", float64(r.Optimum.TrainLoss)), "gap (log)", func(x Round) float64 { return float64(x.Gap) }, true},
	}
	const width, height = 8 * vg.Inch, 12 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadX: vg.Points(6), PadY: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{{nil}, {nil}, {nil}}, tiles, dc)
	for i, p := range panels {
		pl := plot.New()
		pl.Title.Text = p.title
		pl.X.Label.Text = "round"
		pl.Y.Label.Text = p.y
		pl.Legend.Top = true
		logScale := p.log && r.anyPositive(p.val)
		if logScale {
			pl.Y.Scale = plot.LogScale{}
			pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		} else if p.log {
			// No positive gap (the optimum search stopped early and the
			// runs did better): a linear axis shows the signed values.
			pl.Y.Label.Text = "gap"
		}
		for k, run := range r.Runs {
			var pts plotter.XYs
			for _, row := range run.Rounds {
				v := p.val(row)
				if math.IsNaN(v) || math.IsInf(v, 0) || (logScale && !(v > 0)) {
					continue
				}
				pts = append(pts, plotter.XY{X: float64(row.Round), Y: v})
			}
			if len(pts) == 0 {
				continue
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("plot %s: %w", run.Algo, err)
			}
			line.Color = plotutil.Color(k)
			line.Dashes = plotutil.Dashes(k / 7)
			line.Width = vg.Points(1.5)
			pl.Add(line)
			pl.Legend.Add(run.Algo, line)
		}
		if logScale {
			// A log axis needs a positive range.
			if !(pl.Y.Min > 0) {
				pl.Y.Min = 1e-16
			}
			if !(pl.Y.Max > pl.Y.Min) {
				pl.Y.Max = pl.Y.Min * 10
			}
		}
		pl.Draw(canvases[i][0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

func (r *Results) anyPositive(val func(Round) float64) bool {
	for _, run := range r.Runs {
		for _, row := range run.Rounds {
			if v := val(row); v > 0 && !math.IsInf(v, 0) {
				return true
			}
		}
	}
	return false
}
