package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotCurves draws what exactly-once costs (issue 38) into path, a PNG:
// throughput (left) and p99 latency (right) against clients, the full
// checkout beside the naive one, from the median figures med
// (checkout_hot_c{n}_* and naive_c{n}_*).
func plotCurves(med map[string]float64, path string) error {
	series := []struct {
		label, prefix string
		color         color.RGBA
	}{
		{"exactly-once checkout", "checkout_hot_c", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
		{"naive checkout", "naive_c", color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}},
	}
	panel := func(title, ylabel, suffix string) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "clients (log scale)"
		p.Y.Label.Text = ylabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(clientTicks())
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		for _, s := range series {
			var xys plotter.XYs
			for _, n := range curveClients {
				if v, ok := med[fmt.Sprintf("%s%d_%s", s.prefix, n, suffix)]; ok && v > 0 {
					xys = append(xys, plotter.XY{X: float64(n), Y: v})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return nil, err
			}
			l.Color, pts.Color = s.color, s.color
			l.Width = vg.Points(2)
			p.Add(l, pts)
			p.Legend.Add(s.label, l, pts)
		}
		return p, nil
	}
	rate, err := panel("Throughput", "checkouts per second", "per_s")
	if err != nil {
		return err
	}
	p99, err := panel("Latency", "p99 (ms)", "p99_ms")
	if err != nil {
		return err
	}
	img := vgimg.New(vg.Points(900), vg.Points(360))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(20), PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{{rate, p99}}, tiles, dc)
	rate.Draw(canvases[0][0])
	p99.Draw(canvases[0][1])
	return savePNG(img, path)
}

func clientTicks() []plot.Tick {
	var ticks []plot.Tick
	for _, n := range curveClients {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
	}
	return ticks
}

func savePNG(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
