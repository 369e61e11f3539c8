"""The platform's browser pages, served by the same app as the API; server-rendered HTML with
every value escaped (Jinja2 autoescaping), scripts and styles only from this server.

    device.py      /device: approving a CLI's device-code login
    session.py     sign-in cookies and CSRF tokens, one policy for the dashboard and /device
    render.py      templates/, the security headers, /static (package files: the dashboard's
                   CSS and JS, and the vendored uPlot charting library; no CDN, no Node build)
    dashboard.py   /, /login, /logout, a workspace's runs (filters, live status)
    training.py    a training run: overview, six charts (downsampled, live), CSV, checkpoints
                   with deploy/undeploy, logs, configuration
    evaluation.py  an eval run: pass rate, pass@k, histogram, samples, one sample's trajectory
                   and artifacts, two runs side by side
    resources.py   datasets (browser upload), models, secrets (names), members and tokens
    charts.py      metric series, LTTB downsampling, CSV
"""
