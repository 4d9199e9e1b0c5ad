from deploy.local.cli import app

app(prog_name="python -m deploy.local")
